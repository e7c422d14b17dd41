"""throughput: rates from real runs, batch and sequence length from traced shapes or the
run's context, and MFU against the GPU peak table."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
from support.common import train
from support.demo_run import BATCH, SEQ

import swift_nb
from swift_nb.analysis.throughput import peak_flops_per_s, throughput
from swift_nb.analysis.trace.tables import load_trace
from swift_nb.record import STEP_COLUMNS, Run, step_durations


@pytest.fixture(scope="module")
def gpt(demo_gpt):
    return demo_gpt, load_trace(demo_gpt)


def test_token_model_reveals_batch_and_sequence_length(gpt):
    run, trace = gpt
    tp = throughput(run, trace)
    assert (tp.batch_size, tp.seq_len) == (BATCH, SEQ)
    durations, _ = step_durations(run.steps)  # the run's one step time (the Summary's)
    assert (
        tp.steps_per_s == pytest.approx(1 / durations.median()) == pytest.approx(run.summary["steps_per_s"])
    )
    assert tp.samples_per_s == pytest.approx(tp.steps_per_s * BATCH)
    assert tp.tokens_per_s == pytest.approx(tp.samples_per_s * SEQ)
    assert tp.device_name == run.environment["devices"][0]


def test_without_a_flop_count_or_a_gpu_there_is_no_flop_rate_or_mfu(gpt):
    run, trace = gpt
    assert "flops_per_step" not in run.summary
    tp = throughput(run, trace)
    assert tp.flops_per_step is None
    assert tp.achieved_flops_per_s is None
    assert tp.peak_flops_per_s is None
    assert tp.mfu_pct is None

    counted = dataclasses.replace(run, summary={**run.summary, "flops_per_step": 2e9})
    tp = throughput(counted, trace)
    assert tp.achieved_flops_per_s == pytest.approx(2e9 * tp.steps_per_s)
    assert tp.mfu_pct is None  # CPU: no peak to compare with


def test_context_wins_over_traced_shapes(gpt):
    run, trace = gpt
    both = dataclasses.replace(run, context={**run.context, "batch_size": 8, "seq_len": 16})
    tp = throughput(both, trace)
    assert (tp.batch_size, tp.seq_len) == (8, 16)
    # the tokens the model was given, counted at capture, are what tokens/s counts
    assert run.summary["real_tokens_per_step"] == BATCH * SEQ
    assert tp.tokens_per_s == pytest.approx(tp.steps_per_s * BATCH * SEQ)
    uncounted = {k: v for k, v in run.summary.items() if k not in ("tokens_per_step", "real_tokens_per_step")}
    tp = throughput(dataclasses.replace(both, summary=uncounted), trace)
    assert tp.tokens_per_s == pytest.approx(tp.steps_per_s * 8 * 16) and tp.padding_pct is None

    seq_only = dataclasses.replace(run, context={**run.context, "seq_len": 16})
    assert (throughput(seq_only, trace).batch_size, throughput(seq_only, trace).seq_len) == (BATCH, 16)


def test_non_token_model_gives_batch_from_its_first_linear(tmp_path):
    with swift_nb.profile(out_dir=tmp_path, wait=0, warmup=1, active=1) as run:
        train(3, batch=5)
    tp = throughput(run)
    assert tp.batch_size == 5
    assert tp.seq_len is None
    assert tp.samples_per_s == pytest.approx(5 * tp.steps_per_s)
    assert tp.tokens_per_s is None


def _synthetic(device: str, devices: list[str], flops: float | None) -> Run:
    rows = [
        (i, i * 0.01, (i + 1) * 0.01, 0.01, "none", "optimizer", 0.0, None, None, None, 0.0) for i in range(3)
    ]
    # The trailing "end" row is the tail after the last step, far slower: it must not count.
    rows.append((3, 0.03, 5.03, 5.0, "none", "end", 0.0, None, None, None, 0.0))
    return Run(
        id="synthetic",
        environment={"device": device, "devices": devices},
        context={"batch_size": 4, "seq_len": 128},
        summary={} if flops is None else {"flops_per_step": flops},
        steps=pd.DataFrame(rows, columns=STEP_COLUMNS),
    )


def test_mfu_against_the_h100_peak():
    tp = throughput(_synthetic("cuda", ["NVIDIA H100 80GB HBM3"], flops=1e12))
    assert tp.steps_per_s == pytest.approx(100)
    assert tp.tokens_per_s == pytest.approx(100 * 4 * 128)
    assert tp.achieved_flops_per_s == pytest.approx(1e14)
    assert tp.peak_flops_per_s == 989e12
    assert tp.mfu_pct == pytest.approx(100 * 1e14 / 989e12)
    assert tp.device_name == "NVIDIA H100 80GB HBM3"

    # padding counted at capture: tokens/s and MFU count the real tokens only
    padded = _synthetic("cuda", ["NVIDIA H100 80GB HBM3"], flops=1e12)
    padded.summary.update(tokens_per_step=512.0, real_tokens_per_step=256.0)
    real = throughput(padded)
    assert real.tokens_per_s == pytest.approx(100 * 256) and real.padding_pct == pytest.approx(50.0)
    assert real.achieved_flops_per_s == pytest.approx(1e14)  # the work done, pads included
    assert real.mfu_pct == pytest.approx(100 * 0.5e14 / 989e12)

    unknown = throughput(_synthetic("cuda", ["Some Future GPU"], flops=1e12))
    assert unknown.achieved_flops_per_s == pytest.approx(1e14)
    assert unknown.peak_flops_per_s is None and unknown.mfu_pct is None
    assert throughput(_synthetic("cuda", ["NVIDIA H100 80GB HBM3"], flops=None)).mfu_pct is None


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40", None),  # not L4, not L40S
        ("NVIDIA A10G", 125e12),
        ("NVIDIA A10", 125e12),
        ("Tesla V100-SXM2-16GB", 125e12),
        ("Tesla T4", 65e12),
        ("NVIDIA GeForce RTX 4090", 165e12),
        ("NVIDIA GeForce RTX 3090", 71e12),
        ("NVIDIA GeForce RTX 3090 Ti", None),
    ],
)
def test_peak_table_matches_device_names(name, peak):
    assert peak_flops_per_s(name) == peak


def test_the_verdicts_shares_of_the_step_add_up_to_at_most_all_of_it(gpt):
    from swift_nb.analysis.advisor.evidence import gather

    run, trace = gpt
    shares = gather(run, trace).shares
    assert 0.995 <= sum(shares.values()) <= 1.005, shares
