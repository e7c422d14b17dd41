"""What the machine spends while the loop runs: the resource sampler (``sampler``), GPU and
CPU energy (``energy``), the process's resident memory (``rss``) and alerts on the
samples (``alerts``)."""
