"""One module per check, each with ``check(ctx)`` and ``TITLE``; ``registry.CHECKS`` lists them."""
