"""Notebook front: the ``%%swift_profile`` magic. Thin: parse flags, call the API, display."""
