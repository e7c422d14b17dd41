"""The comparison shown: compare.html and its tables and figures (``page``), and what changed
between two runs as text and HTML (``run_diff``)."""
