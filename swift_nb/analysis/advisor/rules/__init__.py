"""The advisor's rules, one file each (``registry.RULES`` lists them in order)."""
