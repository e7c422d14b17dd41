"""Render layer: figures and tables built from Run records (no capture, no IPython)."""
