"""Analysis layer: pure functions over Run records, returning DataFrames or dataclasses."""
