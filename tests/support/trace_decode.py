"""Helpers shared by the tiers of test_trace_decode's tests."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest


@pytest.fixture
def bomb(tmp_path) -> Path:
    """256 MiB of JSON whitespace in a gzip of a few hundred KB."""
    path = tmp_path / "bomb.json.gz"
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(b'{"traceEvents": [')
        block = b" " * (1 << 20)
        for _ in range(256):
            f.write(block)
        f.write(b"]}")
    return path


def write_bomb(path: Path, mib: int, body: bytes = b" ") -> Path:
    """``{"traceEvents": [`` then ``mib`` MiB of ``body`` repeated: one gzip member of 64 MiB
    written again and again (a file gzip reads whole; fast to make at any size)."""
    member = gzip.compress(body * ((64 << 20) // len(body)), compresslevel=9)
    with open(path, "wb") as f:
        f.write(gzip.compress(b'{"traceEvents": ['))
        for _ in range(mib // 64):
            f.write(member)
        f.write(gzip.compress(b"]}"))
    return path
