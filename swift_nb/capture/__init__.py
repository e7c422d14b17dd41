"""Capture layer: step detection, resource sampling, the scheduled torch profiler."""
