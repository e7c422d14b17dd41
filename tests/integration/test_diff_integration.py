"""swift_nb.diff (analysis.diff), its text and HTML (render.diff), compare.html's "What
changed", and the `swift-nb diff` gate: on two real GPU traces imported (tests/data/gpu, from
HolisticTraceAnalysis's test data) and on a CPU pair where the flash_attention toggle swaps
eager attention for SDPA."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.diff import (
    _row,
    gpu_pair,  # noqa: F401 (fixtures)
)

import swift_nb
from swift_nb.analysis.comparison.run_diff import (
    ONLY_A,
    ONLY_B,
    OPERATOR,
)
from swift_nb.analysis.operators import top_operators
from swift_nb.demo import make_model


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "swift_nb.cli", "diff", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_gate_exit_status_on_gpu_traces(gpu_pair):
    a, b = gpu_pair
    slower = _cli(a.path, b.path, "--max-step-regression-pct", 5, "--max-memory-regression-pct", 5)
    assert slower.returncode == 1, slower.stderr
    out = slower.stdout
    # the evidence first, then the verdict on each limit
    assert out.index("What changed: gpu_1rank_5steps → gpu_nccl_2ranks_rank0") < out.index("regression:")
    assert "- communication kernels are new: 15.6 ms per step" in out
    assert "regression: step time +132.8 %, more than the 5 % allowed" in out
    assert "not checked: peak memory: gpu_1rank_5steps and gpu_nccl_2ranks_rank0 record none" in out
    faster = _cli(b.path, a.path, "--max-step-regression-pct", 5)
    assert faster.returncode == 0, faster.stderr
    assert "within: step time −57.0 %, within the 5 % allowed" in faster.stdout
    assert "ncclKernel_AllReduce_RING_LL_Sum_float: 15.6 ms per step → gone" in faster.stdout
    missing = _cli(a.path, Path(a.path).parent / "missing", "--max-step-regression-pct", 5)
    assert missing.returncode == 2 and missing.stdout == "" and "not a swift_nb run folder" in missing.stderr


@pytest.fixture(scope="module")
def flash_pair(tmp_path_factory):
    """The demo GPT with eager attention over 512 tokens, profiled as it is and with the
    flash_attention toggle (SDPA): 4 steps each, 2 recorded."""
    root = tmp_path_factory.mktemp("runs")
    out = []
    for toggles in ([], ["flash_attention"]):
        torch.manual_seed(0)
        model = make_model(seq_len=512, n_layer=2, n_head=2, d_model=32, vocab_size=128, attn_impl="eager")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randint(0, 128, (1, 512))
        with swift_nb.profile(
            out_dir=root,
            wait=0,
            warmup=1,
            active=2,
            report=False,
            label="flash" if toggles else "eager",
            toggles=toggles,
            namespace={"model": model, "opt": opt},
        ) as run:
            for _ in range(4):
                model(x, x).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        out.append(run)
    return tuple(out)


def test_flash_attention_removes_bmm_and_softmax_and_adds_sdpa(flash_pair):
    eager, flash = flash_pair
    d = swift_nb.diff(eager, flash)
    assert (d.a_steps, d.b_steps) == (2, 2) == (len(eager.summary["recorded_steps"]),) * 2
    assert d.environment.set_index("field").loc["toggles"].tolist() == ["none", "flash_attention"]
    assert "toggles: none → flash_attention" in d.sentences
    for gone in ("aten::bmm", "aten::softmax", "aten::_softmax", "aten::masked_fill"):
        assert _row(d, OPERATOR, gone)["status"] == ONLY_A, gone
    sdpa = _row(d, OPERATOR, "aten::scaled_dot_product_attention")
    assert sdpa["status"] == ONLY_B and sdpa["a_ms_per_step"] == 0
    assert not (d.changes["kind"] != OPERATOR).any()  # a CPU run has no kernels
    # per recorded step: the operators' self time over the 2 steps
    ops = top_operators(eager, n=None).set_index("name")
    bmm = _row(d, OPERATOR, "aten::bmm")
    assert bmm["a_ms_per_step"] == pytest.approx(1e3 * ops.loc["aten::bmm", "self_time_s"] / 2)
    said = [re.fullmatch(r"aten::bmm: ([\d.]+) ms per step → gone", s) for s in d.sentences]
    said_ms = [float(m.group(1)) for m in said if m]
    assert said_ms == [pytest.approx(bmm["a_ms_per_step"], rel=0.01, abs=0.01)], d.sentences
    assert any("scaled_dot_product" in s and " is new: " in s for s in d.sentences), d.sentences
    assert d.memory_regression_pct is not None and d.memory_regression_pct < 0  # no score matrices kept


def test_memory_gate_on_the_flash_pair(flash_pair):
    eager, flash = flash_pair
    back = _cli(flash.path, eager.path, "--max-memory-regression-pct", 5)
    assert back.returncode == 1, back.stdout + back.stderr
    assert "aten::bmm is new: " in back.stdout
    assert "regression: peak memory +" in back.stdout
    forward = _cli(eager.path, flash.path, "--max-memory-regression-pct", 5)
    assert forward.returncode == 0 and "within: peak memory −" in forward.stdout


def test_rerun_comparison_page_says_what_changed(flash_pair):
    from swift_nb.rerun import Outcome, comparison

    eager, flash = flash_pair
    compared = comparison(
        [
            (Outcome("baseline", "ok", str(eager.path)), eager),
            (Outcome("flash_attention", "ok", str(flash.path)), flash),
        ]
    )
    assert compared.html_path is not None
    page = compared.html_path.read_text()
    assert "<h3>baseline → flash_attention</h3>" in page and "aten::bmm: " in page
