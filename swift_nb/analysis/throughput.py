"""How fast a run trains: steps, samples and tokens per second, and model FLOPs utilisation.

All rates are this process's (one rank's); ``steps_per_s`` comes from the median step time,
so a slow first step or a profiled step does not drag it down.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pandas as pd

from swift_nb.analysis.trace.shapes import input_dims
from swift_nb.analysis.trace.tables import Trace, load_trace
from swift_nb.core.devices import peak_flops_per_s
from swift_nb.record import Run, step_durations

# Ops whose data input's leading dimension is the batch, and which input that is.
_BATCH_INPUT = {"aten::linear": 0, "aten::addmm": 1, "aten::conv1d": 0, "aten::conv2d": 0, "aten::conv3d": 0}


@dataclass
class Throughput:
    """Training speed of one run; None where the record does not tell.

    steps_per_s: optimizer steps per second (1 / median step time);
    samples_per_s: steps_per_s × batch_size; tokens_per_s: the real tokens (padding left
    out) the model was given per step, as the capture counted them (``capture.tokens``), ×
    steps_per_s; without a count, samples_per_s × seq_len;
    flops_per_step: floating-point operations in one step (counted at capture);
    achieved_flops_per_s: flops_per_step × steps_per_s (FLOP/s);
    peak_flops_per_s: the GPU's dense bf16/fp16 tensor-core peak (FLOP/s; CUDA only; from
    ``swift_nb.core.devices.PEAK_FLOPS_PER_S``);
    mfu_pct: model FLOPs utilisation, achieved / peak (%), of the real tokens' share of the
    FLOPs when padding was counted (the pads' FLOPs are work, not progress);
    padding_pct: the share of the tokens computed that are padding (None: not counted);
    batch_size: samples per step; seq_len: tokens per sample;
    device_name: the device as the run's environment names it.
    """

    steps_per_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    flops_per_step: float | None = None
    achieved_flops_per_s: float | None = None
    peak_flops_per_s: float | None = None
    mfu_pct: float | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    device_name: str | None = None
    padding_pct: float | None = None


def throughput(
    run: Run, trace: Trace | None = None, traced: tuple[int | None, int | None] | None = None
) -> Throughput:
    """The run's throughput. Batch size and sequence length come from ``run.context``
    (``batch_size``, ``seq_len``) when given, else from the traced input shapes (see
    ``batch_and_seq``); ``flops_per_step`` from ``run.summary``. ``trace``: the run's trace,
    and ``traced``: ``batch_and_seq`` of its events, when the caller holds them."""
    steps_per_s = _steps_per_s(run.steps)
    batch, seq = run.context.get("batch_size"), run.context.get("seq_len")
    if batch is None or seq is None:
        if traced is None:
            traced = batch_and_seq((trace if trace is not None else load_trace(run)).events)
        found_batch, found_seq = traced
        batch = batch if batch is not None else found_batch
        seq = seq if seq is not None else found_seq

    samples_per_s = steps_per_s * batch if steps_per_s is not None and batch is not None else None
    tokens_per_s = samples_per_s * seq if samples_per_s is not None and seq is not None else None
    # tokens the model was given, counted at capture (capture.tokens): the real ones count
    counted, real = run.summary.get("tokens_per_step"), run.summary.get("real_tokens_per_step")
    real_share = None
    if counted and real is not None:
        real_share = float(real) / float(counted)
        if steps_per_s is not None:
            tokens_per_s = float(real) * steps_per_s
    flops = run.summary.get("flops_per_step")
    achieved = flops * steps_per_s if flops is not None and steps_per_s is not None else None
    devices = run.environment.get("devices") or []
    name = devices[0] if devices else None
    peak = peak_flops_per_s(name) if run.environment.get("device") == "cuda" and name else None
    useful = achieved * real_share if achieved is not None and real_share is not None else achieved
    mfu = 100.0 * useful / peak if useful is not None and peak else None
    return Throughput(
        steps_per_s=steps_per_s,
        samples_per_s=samples_per_s,
        tokens_per_s=tokens_per_s,
        flops_per_step=flops,
        achieved_flops_per_s=achieved,
        peak_flops_per_s=peak,
        mfu_pct=mfu,
        batch_size=batch,
        seq_len=seq,
        device_name=name,
        padding_pct=100.0 * (1.0 - real_share) if real_share is not None else None,
    )


def batch_and_seq(events: pd.DataFrame) -> tuple[int | None, int | None]:
    """(batch size, sequence length) the traced input shapes reveal.

    A token model looks up a ``[batch, seq]`` index tensor in ``aten::embedding`` (its
    second input; the most common such shape wins). Otherwise the batch is the leading
    dimension of the data input of the earliest linear, addmm or convolution; the
    sequence length stays unknown.
    """
    emb = events.loc[events["name"] == "aten::embedding", "input_dims"]
    indices = Counter(
        tuple(dims[1]) for dims in map(input_dims, emb) if len(dims) > 1 and dims[1] and len(dims[1]) == 2
    )
    if indices:
        batch, seq = indices.most_common(1)[0][0]
        return int(batch), int(seq)
    first = events[events["name"].isin(_BATCH_INPUT)].sort_values("ts_us", kind="stable")
    for name, text in first[["name", "input_dims"]].itertuples(index=False):
        dims = input_dims(text)
        arg = _BATCH_INPUT[name]
        if len(dims) > arg and dims[arg]:
            return int(dims[arg][0]), None
    return None, None


def _steps_per_s(steps: pd.DataFrame) -> float | None:
    """1 / the run's step time: the median of the steady steps that ran with the profiler
    off (``record.step_durations``, the Summary's definition)."""
    dur, _ = step_durations(steps)
    median = float(dur.median()) if len(dur) else 0.0
    return 1.0 / median if median > 0 else None
