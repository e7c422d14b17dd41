"""Helpers shared by the tiers of test_finetune_rules's tests."""

from __future__ import annotations

import pytest

peft = pytest.importorskip("peft")


transformers = pytest.importorskip("transformers")
