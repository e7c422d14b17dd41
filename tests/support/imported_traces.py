"""Helpers shared by the tiers of test_import's tests."""

from __future__ import annotations

from pathlib import Path

GPU = Path(__file__).parents[1] / "data" / "gpu"


NCCL_RANK0 = GPU / "gpu_nccl_2ranks_rank0.json.gz"
JOB = [GPU / "gpu_128ranks_rank0.json.gz", GPU / "gpu_128ranks_rank1.json.gz"]
