"""Helpers shared by test modules of different tiers."""
