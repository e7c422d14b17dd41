"""throughput: rates from real runs, batch and sequence length from traced shapes or the
run's context, and MFU against the GPU peak table.

The real run's rates are checked against what the test itself fed and timed: a known batch
and sequence length, a known number of steps under a known profiler schedule (so which steps
ran with the profiler off is known without the product's selection), and the test's own
``time.perf_counter`` after each ``optimizer.step()``. Rates are compared with the known
tokens divided by the recorded step time, and the recorded step time with the test's clock
over the same steps; nothing asserts how long a step takes."""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass

import pandas as pd
import pytest
import torch
from support.common import train

import swift_nb
from swift_nb.analysis.throughput import peak_flops_per_s, throughput
from swift_nb.analysis.trace.tables import Trace, load_trace
from swift_nb.demo import make_model
from swift_nb.record import STEP_COLUMNS, Run

BATCH, SEQ, VOCAB = 8, 64, 256
#: optimizer steps the loop runs, and the profiler's schedule: steps 0 (warmup) and 1–2
#: (active) are traced, steps 3 on run with the profiler off
STEPS, WARMUP, ACTIVE = 10, 1, 2
OFF_STEPS = range(WARMUP + ACTIVE, STEPS)
#: how far the recorded step time may be from the test's own clock over the same steps (the
#: test's interval also holds swift_nb's step hook, a fraction of a millisecond off-profiler)
CLOCK_TOLERANCE = 0.15


@dataclass
class Timed:
    run: Run
    trace: Trace
    #: seconds from the end of ``optimizer.step()`` of step k - 1 to that of step k, by the
    #: test's clock (k ≥ 1)
    intervals_s: dict[int, float]

    @property
    def step_time_s(self) -> float:
        """The recorded step time as the test selects it: the median duration of the steps
        the schedule ran with the profiler off."""
        rows = self.run.steps[self.run.steps["trigger"] != "end"].set_index("step")
        return statistics.median(float(rows.loc[k, "duration_s"]) for k in OFF_STEPS)


@pytest.fixture(scope="module")
def timed(tmp_path_factory) -> Timed:
    torch.manual_seed(0)
    model = make_model(seq_len=SEQ, n_layer=2, d_model=128, n_head=2, vocab_size=VOCAB)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, VOCAB, (BATCH, SEQ))
    ends: list[float] = []
    out = tmp_path_factory.mktemp("timed")
    with swift_nb.profile(out_dir=out, wait=0, warmup=WARMUP, active=ACTIVE, report=False) as run:
        for _ in range(STEPS):
            model(x, x).backward()
            opt.step()
            ends.append(time.perf_counter())
            opt.zero_grad()
    run = swift_nb.load_run(run.path)
    return Timed(run, load_trace(run), {k: ends[k] - ends[k - 1] for k in range(1, STEPS)})


def test_token_model_reveals_batch_and_sequence_length(timed):
    tp = throughput(timed.run, timed.trace)
    assert (tp.batch_size, tp.seq_len) == (BATCH, SEQ)
    assert tp.device_name == timed.run.environment["devices"][0]


def test_the_rates_are_the_known_tokens_over_the_recorded_step_time(timed):
    run = timed.run
    assert int((run.steps["trigger"] != "end").sum()) == STEPS
    assert run.summary["real_tokens_per_step"] == run.summary["tokens_per_step"] == BATCH * SEQ
    step_s = timed.step_time_s
    tp = throughput(run, timed.trace)
    assert tp.steps_per_s == pytest.approx(1 / step_s, rel=1e-9)
    assert tp.samples_per_s == pytest.approx(BATCH / step_s, rel=1e-9)
    assert tp.tokens_per_s == pytest.approx(BATCH * SEQ / step_s, rel=1e-9)
    assert run.summary["steps_per_s"] == pytest.approx(1 / step_s, rel=1e-9)  # the Summary's, the same


def test_the_recorded_step_time_is_what_the_tests_clock_saw(timed):
    """The same off-profiler steps timed by the test: seconds, the same steps, no hook cost of
    the traced steps carried in."""
    mine = statistics.median(timed.intervals_s[k] for k in OFF_STEPS)
    assert timed.step_time_s == pytest.approx(mine, rel=CLOCK_TOLERANCE), (timed.step_time_s, mine)


def test_without_a_flop_count_or_a_gpu_there_is_no_flop_rate_or_mfu(timed):
    run, trace = timed.run, timed.trace
    assert "flops_per_step" not in run.summary
    tp = throughput(run, trace)
    assert tp.flops_per_step is None
    assert tp.achieved_flops_per_s is None
    assert tp.peak_flops_per_s is None
    assert tp.mfu_pct is None

    counted = dataclasses.replace(run, summary={**run.summary, "flops_per_step": 2e9})
    tp = throughput(counted, trace)
    assert tp.achieved_flops_per_s == pytest.approx(2e9 / timed.step_time_s, rel=1e-9)
    assert tp.mfu_pct is None  # CPU: no peak to compare with


def test_context_wins_over_traced_shapes(timed):
    run, trace, step_s = timed.run, timed.trace, timed.step_time_s
    both = dataclasses.replace(run, context={**run.context, "batch_size": 4, "seq_len": 16})
    tp = throughput(both, trace)
    assert (tp.batch_size, tp.seq_len) == (4, 16)
    # the tokens the model was given, counted at capture, are what tokens/s counts
    assert tp.tokens_per_s == pytest.approx(BATCH * SEQ / step_s, rel=1e-9)
    uncounted = {k: v for k, v in run.summary.items() if k not in ("tokens_per_step", "real_tokens_per_step")}
    tp = throughput(dataclasses.replace(both, summary=uncounted), trace)
    assert tp.tokens_per_s == pytest.approx(4 * 16 / step_s, rel=1e-9) and tp.padding_pct is None

    seq_only = dataclasses.replace(run, context={**run.context, "seq_len": 16})
    assert (throughput(seq_only, trace).batch_size, throughput(seq_only, trace).seq_len) == (BATCH, 16)


def test_non_token_model_gives_batch_from_its_first_linear(tmp_path):
    with swift_nb.profile(out_dir=tmp_path, wait=0, warmup=1, active=1) as run:
        train(6, batch=5)
    tp = throughput(run)
    assert tp.batch_size == 5
    assert tp.seq_len is None
    rows = run.steps[run.steps["trigger"] != "end"].set_index("step")
    step_s = statistics.median(float(rows.loc[k, "duration_s"]) for k in range(2, 6))  # off the profiler
    assert tp.samples_per_s == pytest.approx(5 / step_s, rel=1e-9)
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


def test_the_verdicts_shares_of_the_step_add_up_to_at_most_all_of_it(timed):
    from swift_nb.analysis.advisor.evidence import gather

    shares = gather(timed.run, timed.trace).shares
    assert 0.995 <= sum(shares.values()) <= 1.005, shares
