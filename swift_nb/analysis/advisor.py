"""Rules that turn a run's evidence into a bottleneck verdict and concrete advice.

Each rule reads numbers the other analyses computed (breakdown shares, memory by
category, attention shapes in the trace, memory growth) and, when its threshold is
crossed, returns a Finding with those numbers, the change to make, the swift_nb toggle
that applies it, and the predicted effect with the formula behind it. When the run's
context recorded a Hugging Face Trainer or an accelerate Accelerator driving the loop,
the change is phrased as the setting to edit (``TrainingArguments(dataloader_num_workers=4)``,
see ``swift_nb.integrations``); otherwise as plain PyTorch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from swift_nb import integrations
from swift_nb import trace_names as tn
from swift_nb.analysis.breakdown import step_breakdown
from swift_nb.analysis.comm import collectives, comm_per_step, comm_shares
from swift_nb.analysis.findings import Finding, Verdict
from swift_nb.analysis.memory import memory_footprint, memory_growth
from swift_nb.analysis.operators import op_self_times_us
from swift_nb.analysis.shapes import input_dims
from swift_nb.analysis.throughput import batch_and_seq
from swift_nb.analysis.trace import Trace, load_trace, per_value
from swift_nb.record import Run
from swift_nb.units import fmt_bytes, fmt_seconds

GALORE_RANK = 128
# In the name of an ``enumerate(DataLoader)`` span when worker processes load the batches
# (``_SingleProcessDataLoaderIter.__next__`` when the main process does).


@dataclass
class Thresholds:
    """When each rule fires. Shares are fractions of the profiled step time or of the
    peak tensor memory; ``memory_limit_bytes`` overrides the device's capacity."""

    data_share: float = 0.20
    # Data-loading advice also needs this much loading per step (s). A single-process
    # DataLoader over in-memory tensors with the default collate spends ≈ 0.1–0.7 ms per
    # batch of 8–64 samples on its own Python (sampler, per-sample indexing, stack; measured
    # on CPU), and receiving a batch from a worker process costs the main process as much
    # or more (queue get, unpickling, attaching shared memory: 0.3–2 ms measured). Below
    # 2 ms loading is that fixed cost, not slow collate, transforms or I/O, and workers
    # cannot win it back: a large share of such a step (under 2 ms / data_share = 10 ms)
    # only says the step is tiny.
    data_min_s: float = 0.002
    comm_share: float = 0.30
    tiny_op_us: float = 50.0  # ops with less self time than this are "tiny" …
    tiny_op_count: int = 300  # … and with this many ops per step …
    heavy_op_share: float = 0.5  # … if ops of at least tiny_op_us fill less of the step:
    # launch and dispatch overhead, not math, sets the step time
    attention_seq: int = 1024
    activation_share: float = 0.50
    # fp32 activations of a Trainer or Accelerator run without mixed precision: this share
    # of the peak, halved by bf16 autocast, is worth a setting
    fp32_activation_share: float = 0.25
    optimizer_share: float = 0.40
    near_limit: float = 0.80
    long_seq: int = 4096
    leak_bytes_per_step: float = 1 << 20  # 1 MiB per step, and …
    leak_share_per_step: float = 0.005  # … 0.5 % of the peak per step
    memory_limit_bytes: float | None = None


@dataclass
class Loader:
    """The DataLoader as the trace shows it, medians over the profiled steps.

    data_s: seconds per step inside ``enumerate(DataLoader)`` spans (the breakdown's
    ``data_s``); ops_s: the part of them in torch ops (indexing, the collate's stack,
    tensor transforms), the rest being Python: the loader's own per-batch work,
    ``__getitem__``, decoding, I/O, sleeping. samples: samples per batch, from the default
    collate's stack (0: unknown). in_workers: whether worker processes load the batches
    (None: no DataLoader in the trace); num_workers: as the run's context recorded it.
    """

    data_s: float = 0.0
    ops_s: float = 0.0
    samples: int = 0
    in_workers: bool | None = None
    num_workers: int | None = None

    @property
    def python_s(self) -> float:
        return max(0.0, self.data_s - self.ops_s)

    @property
    def s_per_sample(self) -> float | None:
        return self.data_s / self.samples if self.samples else None

    def where(self) -> str:
        """Who loads the batches, in words."""
        if not self.in_workers:
            return (
                "main process (num_workers=0)" if self.in_workers is False else "no DataLoader in the trace"
            )
        if self.num_workers:
            return f"{self.num_workers} worker processes"
        return "worker processes"


@dataclass
class ScoreMemory:
    """The [.., T, T] tensors of an eager attention (scores, probabilities, masks and their
    gradients) in a recorded step's allocations: the median step, on the device where they
    matter most.

    at_peak_bytes: their bytes alive at the step's peak; kept: how many of those were
    allocated before backward began (saved for it), temporaries: how many during it;
    saved_bytes: how much lower the step's peak is without any of them (the peak of live
    bytes minus theirs, over the whole step: the peak can move elsewhere)."""

    at_peak_bytes: float
    kept: int
    temporaries: int
    saved_bytes: float


@dataclass
class Evidence:
    """The numbers the rules look at (medians over the profiled steps)."""

    step_s: float
    shares: dict[str, float]  # part of step time, 0..1, keyed like the breakdown's parts
    ops_per_step: float
    median_op_us: float
    heavy_op_share: float  # part of the step in ops with self time ≥ tiny_op_us, 0..1
    attention_seq: int  # largest T of an eager [.., T, T] attention softmax (0: none)
    attention_shape: list[int]
    attention_layers: int  # eager attention softmax calls per step
    footprint: pd.DataFrame
    peak_bytes: float
    limit_bytes: float | None
    growth_bytes_per_step: float
    growth_source: str
    loader: Loader = field(default_factory=Loader)
    # attention calls per step (eager softmax over [.., T, T] and scaled_dot_product_attention):
    # the repeated blocks of a transformer, one attention each (0: no attention in the trace)
    attention_calls: int = 0
    scores: ScoreMemory | None = None  # [.., T, T] tensors at the peak (eager attention only)
    world_size: int = 1
    comm: pd.DataFrame | None = None  # collectives per kind (swift_nb.analysis.comm)
    # Parts of the profiled steps' time, 0..1 (swift_nb.analysis.comm): collective time, and
    # exposed communication (what no compute kernel hides; all of it on CPU, where gloo
    # runs on the cores the backward needs).
    collective_share: float = 0.0
    exposed_comm_share: float = 0.0
    # element types of the matmuls' inputs in the trace ("float", "c10::BFloat16", …): all
    # "float" means the forward ran in fp32, without autocast
    matmul_types: frozenset[str] = frozenset()


#: the ops autocast lowers to 16 bits; their recorded input types tell whether it was on
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm")
FLOATING = frozenset(
    {"float", "double", "c10::BFloat16", "c10::Half", "c10::Float8_e4m3fn", "c10::Float8_e5m2"}
)


def _matmul_types(ops: pd.DataFrame) -> frozenset[str]:
    types = ops.loc[ops["name"].isin(MATMULS), "input_types"]
    found: set[str] = set()
    for text in types.unique():
        found |= {t.strip(" '\"") for t in str(text).strip("[]").split(",") if t.strip(" '\"")}
    return frozenset(found)


def gather(
    run: Run,
    trace: Trace | None = None,
    thresholds: Thresholds | None = None,
    breakdown: pd.DataFrame | None = None,
) -> Evidence:
    th = thresholds or Thresholds()
    trace = trace if trace is not None else load_trace(run)
    bd = breakdown if breakdown is not None else step_breakdown(run, trace)
    step_s = float(bd["step_s"].median()) if len(bd) else float("nan")
    shares = {}
    for col in (
        "data_s",
        "forward_s",
        "backward_s",
        "optimizer_s",
        "comm_s",
        "h2d_s",
        "other_s",
        "untraced_s",
    ):
        shares[col.removesuffix("_s")] = float((bd[col] / bd["step_s"]).median()) if len(bd) else 0.0
    ops = trace.events[(trace.events["cat"] == "cpu_op") & (trace.events["step"] >= 0)]
    n_steps = max(1, len(trace.steps))
    ops_per_step = len(ops) / n_steps
    self_us = op_self_times_us(trace.events).reindex(ops.index)
    median_op_us = float(self_us.median()) if len(ops) else float("nan")
    span_us = float(trace.steps["dur_us"].sum()) if len(trace.steps) else 0.0
    heavy = float(self_us[self_us >= th.tiny_op_us].sum() / span_us) if span_us else 0.0
    seq, shape, layers = _eager_attention(ops, n_steps)
    sdpa = int(ops["name"].eq(SDPA).sum())
    fp = memory_footprint(run)
    peak = float(fp["at_peak_bytes"].sum()) if len(fp) else float(run.summary.get("peak_mem_bytes") or 0.0)
    growth, source = memory_growth(run)
    world = int(run.context.get("world_size") or run.environment.get("world_size") or 1)
    collective_share, exposed_comm_share = comm_shares(comm_per_step(trace))
    return Evidence(
        collective_share=collective_share,
        exposed_comm_share=exposed_comm_share,
        world_size=world,
        comm=collectives(trace, world, int(run.environment.get("rank", 0))),
        step_s=step_s,
        shares=shares,
        ops_per_step=ops_per_step,
        median_op_us=median_op_us,
        heavy_op_share=heavy,
        attention_seq=seq,
        attention_shape=shape,
        attention_layers=layers,
        # an SDPA that falls back to its math kernel runs a softmax of its own: not twice
        attention_calls=max(layers, round(sdpa / n_steps)),
        scores=_score_memory(trace, ops) if seq else None,
        footprint=fp,
        peak_bytes=peak,
        limit_bytes=th.memory_limit_bytes if th.memory_limit_bytes is not None else _device_limit(run),
        growth_bytes_per_step=growth,
        growth_source=source,
        loader=_loader(trace, bd, ops, run),
        matmul_types=_matmul_types(ops),
    )


def _loader(trace: Trace, bd: pd.DataFrame, ops: pd.DataFrame, run: Run) -> Loader:
    """What the ``enumerate(DataLoader)`` spans of the profiled steps hold (``ops``: the
    steps' cpu ops)."""
    ev = trace.events
    spans = ev[(ev["step"] >= 0).to_numpy() & per_value(ev["name"], lambda n: tn.DATA.search(n) is not None)]
    context_workers = run.context.get("num_workers")
    num_workers = int(context_workers) if context_workers is not None else None
    if spans.empty:
        return Loader(
            num_workers=num_workers, in_workers=bool(num_workers) if num_workers is not None else None
        )
    ops = ops[~per_value(ops["name"], lambda n: tn.DATA.search(n) is not None)]
    ops_s = dict.fromkeys(bd["step"], 0.0)
    samples = []
    for tid, start, end, step in spans[["tid", "ts_us", "end_us", "step"]].itertuples(index=False):
        inside = ops[(ops["tid"] == tid) & (ops["ts_us"] >= start) & (ops["end_us"] <= end)]
        ops_s[step] = ops_s.get(step, 0.0) + tn.length(tn.union(inside["ts_us"], inside["end_us"])) / 1e6
        stacks = inside[
            (inside["name"] == tn.COLLATE_STACK) & inside["input_types"].str.startswith("['TensorList'")
        ]
        try:
            stacked = len(json.loads(stacks["input_dims"].iloc[0])[0]) if len(stacks) else 0
        except (ValueError, IndexError, TypeError):
            stacked = 0
        if stacked:
            samples.append(stacked)
    in_workers = bool(spans["name"].str.contains(tn.WORKER_LOADER, regex=False).any())
    if num_workers is not None:
        in_workers = num_workers > 0
    data_s = float(bd["data_s"].median()) if len(bd) else 0.0
    return Loader(
        data_s=data_s,
        ops_s=min(data_s, float(np.median([ops_s.get(s, 0.0) for s in bd["step"]])) if len(bd) else 0.0),
        samples=_batch_samples(samples, trace, run),
        in_workers=in_workers,
        num_workers=num_workers,
    )


def _batch_samples(collated: list[int], trace: Trace, run: Run) -> int:
    """Samples per batch: as the run's context says, else how many tensors the collate
    stacked (the profiler leaves long lists' shapes out), else the batch the model's
    inputs show; 0 when nothing tells."""
    if run.context.get("batch_size"):
        return int(run.context["batch_size"])
    if collated:
        return int(np.median(collated))
    return batch_and_seq(trace.events)[0] or 0


SDPA = "aten::scaled_dot_product_attention"
SOFTMAX = ("aten::softmax", "aten::_softmax", "aten::_safe_softmax")


def _eager_attention(ops: pd.DataFrame, n_steps: int) -> tuple[int, list[int], int]:
    """Softmax over a square [.., T, T] input is an explicit attention score matrix."""
    best, shape, calls = 0, [], 0
    soft = ops[ops["name"].isin(SOFTMAX)]
    for dims_text in soft["input_dims"]:
        try:
            dims = json.loads(dims_text)[0] if dims_text else []
        except (ValueError, IndexError):
            continue
        if len(dims) >= 2 and dims[-1] == dims[-2] and dims[-1] > 1:
            calls += 1
            if dims[-1] > best:
                best, shape = int(dims[-1]), list(dims)
    # aten::softmax wraps aten::_softmax: count each attention once
    per_step = calls / n_steps
    if {"aten::softmax", "aten::_softmax"} <= set(soft["name"]):
        per_step /= 2
    return best, shape, round(per_step)


def _square_inputs(ops: pd.DataFrame) -> set[tuple[int, ...]]:
    """The shapes of every [.., T, T] input of a softmax: the attention score matrices."""
    out = set()
    for dims_text in ops.loc[ops["name"].isin(SOFTMAX), "input_dims"]:
        dims = input_dims(dims_text)
        d = dims[0] if dims and isinstance(dims[0], list) else []
        if len(d) >= 2 and d[-1] == d[-2] and d[-1] > 1:
            out.add(tuple(int(x) for x in d))
    return out


def _square_sizes(shapes: set[tuple[int, ...]]) -> set[int]:
    """Bytes of a [.., T, T] tensor over any of the score shapes' leading dims (a [T, T]
    or [B, 1, T, T] mask, [B·H, T, T] scores …) at 1, 2, 4 or 8 bytes per element."""
    sizes = set()
    for shape in shapes:
        lead, square = shape[:-2], shape[-1] * shape[-2]
        for mask in range(1 << len(lead)):
            n = square * math.prod(d for i, d in enumerate(lead) if mask >> i & 1)
            sizes.update(n * e for e in (1, 2, 4, 8))
    return sizes


def _ints(values: list) -> bool:
    return all(isinstance(v, int) for v in values)


def _makes_scores(op_dims: np.ndarray, seqs: set[int]) -> bool:
    """Whether any of these ops (those enclosing an allocation) works on a [.., T, T]
    tensor: takes one, or multiplies [.., T, k] by [.., k, T]."""
    for text in op_dims:
        # a tensor's shape: a list of ints (a TensorList input, as in cat, is a list of them)
        shapes = [d for d in input_dims(text) if isinstance(d, list) and len(d) >= 2 and _ints(d)]
        if any(d[-1] == d[-2] and d[-1] in seqs for d in shapes):
            return True
        if len(shapes) >= 2 and shapes[0][-2] in seqs and shapes[1][-1] == shapes[0][-2]:
            return True
    return False


def _score_memory(trace: Trace, ops: pd.DataFrame) -> ScoreMemory | None:
    """The [.., T, T] tensors of eager attention (scores, probabilities, masks and their
    gradients) in the recorded steps' allocations, from the trace's memory events (None
    without them). An allocation is one when its size is that of a [.., T, T] tensor of a
    softmax's score shape (``_square_sizes``) and an op enclosing it works on [.., T, T]
    tensors, so a tensor of the same size elsewhere (the logits, an MLP's hidden layer) is
    not one. The median step of the device where they matter most."""
    mem = trace.memory[trace.memory["step"] >= 0]
    shapes = _square_inputs(ops)
    if mem.empty or not shapes:
        return None
    seqs = {shape[-1] for shape in shapes}
    sizes = _square_sizes(shapes)
    backward = trace.events[trace.events["name"].str.startswith(tn.AUTOGRAD_PREFIX)]
    first_backward = backward.groupby("step")["ts_us"].min()
    per_step: dict[int, ScoreMemory] = {}
    for (step, _), m in mem.groupby(["step", "device_type"]):
        step_ops = ops[ops["step"] == step]
        op_start, op_end = step_ops["ts_us"].to_numpy(), step_ops["end_us"].to_numpy()
        op_dims = step_ops["input_dims"].to_numpy()
        ts_us, nbytes, addrs = m["ts_us"].to_numpy(), m["bytes"].to_numpy(), m["addr"].to_numpy()
        backward_us = first_backward.get(step, np.inf)
        # per event: score bytes, and score tensors kept for backward / made in it, +1 or -1
        scores, kept, temporaries = np.zeros(len(m)), np.zeros(len(m)), np.zeros(len(m))
        open_scores: dict = {}  # addr -> allocated before backward began
        for i in np.flatnonzero(np.isin(np.abs(nbytes), list(sizes))):
            ts, addr = ts_us[i], addrs[i]
            if nbytes[i] > 0:
                if not _makes_scores(op_dims[(op_start <= ts) & (op_end >= ts)], seqs):
                    continue
                open_scores[addr] = before = bool(ts < backward_us)
                sign = 1
            elif addr in open_scores:
                before, sign = open_scores.pop(addr), -1
            else:
                continue
            scores[i] = nbytes[i]
            (kept if before else temporaries)[i] = sign
        if not scores.any():
            continue
        live, score_live = np.cumsum(nbytes), np.cumsum(scores)
        peak = int(np.argmax(live))
        found = ScoreMemory(
            at_peak_bytes=float(score_live[peak]),
            kept=int(kept[: peak + 1].sum()),
            temporaries=int(temporaries[: peak + 1].sum()),
            saved_bytes=float(live[peak] - np.max(live - score_live)),
        )
        if step not in per_step or found.saved_bytes > per_step[step].saved_bytes:
            per_step[int(step)] = found
    if not per_step:
        return None
    ranked = sorted(per_step.values(), key=lambda f: f.saved_bytes)
    return ranked[(len(ranked) - 1) // 2]


def _device_limit(run: Run) -> float | None:
    """Memory capacity of the device the tensors live on (bytes)."""
    cols = [c for c in run.samples.columns if c.startswith("gpu") and c.endswith("_mem_total_bytes")]
    if cols:
        return float(pd.to_numeric(run.samples[cols[0]], errors="coerce").max())
    if run.environment.get("device") == "cpu":
        return run.environment.get("mem_total_bytes")
    return None


def _pct(x: float) -> float:
    return round(100.0 * x, 1)


def bottleneck(ev: Evidence, th: Thresholds | None = None) -> Verdict:
    """The step's dominant limit, from the evidence."""
    th = th or Thresholds()
    s = ev.shares
    if not math.isfinite(ev.step_s):
        return Verdict("unknown", "the profiler recorded no step", {})
    compute = s["forward"] + s["backward"] + s["optimizer"]
    base = {"step_s": round(ev.step_s, 6), **{f"{k}_pct": _pct(v) for k, v in s.items()}}
    if ev.exposed_comm_share >= th.comm_share and ev.exposed_comm_share >= s["data"]:
        why = f"{_pct(ev.exposed_comm_share)} % of the step is exposed communication"
        return Verdict("communication-bound", why, base)
    loading = {**base, "data_s_per_step": round(ev.loader.data_s, 6)}
    if _slow_loading(ev, th):
        why = f"{_pct(s['data'])} % of the step ({_ms(ev.loader.data_s)} per step) waits for the next batch"
        return Verdict("data-bound", why, loading)
    if _tiny_step(ev, th):
        why = (
            f"the step is tiny ({_ms(ev.step_s)}): the DataLoader's {_ms(ev.loader.data_s)} per step, "
            f"the time of a few Python calls, is {_pct(s['data'])} % of it"
        )
        return Verdict("overhead-bound", why, loading)
    near = ev.limit_bytes and ev.peak_bytes >= th.near_limit * ev.limit_bytes
    if near or ev.attention_seq >= th.attention_seq:
        why = (
            f"peak tensor memory {fmt_bytes(ev.peak_bytes)} is {_pct(ev.peak_bytes / ev.limit_bytes)} % of the device"
            if near
            else f"explicit attention materialises {ev.attention_seq}×{ev.attention_seq} score matrices"
        )
        return Verdict(
            "memory-bound", why, {**base, "peak_mem_bytes": ev.peak_bytes, "attention_seq": ev.attention_seq}
        )
    if _overhead(ev, th):
        return Verdict(
            "overhead-bound",
            f"{round(ev.ops_per_step)} ops per step; ops of ≥ {th.tiny_op_us:g} µs fill only "
            f"{_pct(ev.heavy_op_share)} % of it",
            {**base, "ops_per_step": round(ev.ops_per_step), "heavy_op_pct": _pct(ev.heavy_op_share)},
        )
    return Verdict(
        "compute-bound", f"{_pct(compute)} % of the step is forward, backward and optimizer work", base
    )


def _overhead(ev: Evidence, th: Thresholds) -> bool:
    return ev.ops_per_step >= th.tiny_op_count and ev.heavy_op_share < th.heavy_op_share


def _slow_loading(ev: Evidence, th: Thresholds) -> bool:
    """Waiting for batches is a large part of the step and long in itself: real work
    (collate, transforms, I/O) that worker processes can take off the step."""
    return ev.shares["data"] >= th.data_share and ev.loader.data_s >= th.data_min_s


def _tiny_step(ev: Evidence, th: Thresholds) -> bool:
    """Loading is a large part of the step but only the loader's fixed per-batch cost:
    the step is tiny (under ``data_min_s / data_share``)."""
    return ev.shares["data"] >= th.data_share and ev.loader.data_s < th.data_min_s


def _ms(seconds: float) -> str:
    """Step-scale times: ``0.36 ms`` rather than ``361 µs`` between 0.1 and 1 ms."""
    return f"{seconds * 1e3:.2f} ms" if 1e-4 <= seconds < 1e-3 else fmt_seconds(seconds)


def advise(
    run: Run,
    trace: Trace | None = None,
    thresholds: Thresholds | None = None,
    breakdown: pd.DataFrame | None = None,
) -> tuple[Verdict, list[Finding]]:
    """The verdict and every finding whose rule fires for this run."""
    _, verdict, findings = advise_with_evidence(run, trace, thresholds, breakdown)
    return verdict, findings


def advise_with_evidence(
    run: Run,
    trace: Trace | None = None,
    thresholds: Thresholds | None = None,
    breakdown: pd.DataFrame | None = None,
) -> tuple[Evidence, Verdict, list[Finding]]:
    """``advise`` and the evidence its rules read."""
    th = thresholds or Thresholds()
    ev = gather(run, trace, th, breakdown)
    findings = [f for rule in RULES if (f := rule(ev, th, run)) is not None]
    return ev, bottleneck(ev, th), findings


# -- rules ---------------------------------------------------------------------------


def _loader_evidence(ev: Evidence) -> dict:
    ld = ev.loader
    out = {
        "data_pct": _pct(ev.shares["data"]),
        "data_s_per_step": round(ld.data_s, 6),
        "data_in_ops_s_per_step": round(ld.ops_s, 6),
        "data_in_python_s_per_step": round(ld.python_s, 6),
    }
    if ld.samples:
        out["samples_per_batch"] = ld.samples
        out["data_s_per_sample"] = round(ld.s_per_sample, 7)
    return {**out, "loaded_by": ld.where(), "step_s": round(ev.step_s, 6)}


def _per_sample(ld: Loader) -> str:
    return f" ({_ms(ld.s_per_sample)} per sample over {ld.samples})" if ld.samples else ""


def rule_data_loading(ev: Evidence, th: Thresholds, run: Run) -> Finding | None:
    if not _slow_loading(ev, th):
        return None
    share, ld = ev.shares["data"], ev.loader
    if ld.in_workers:
        diagnosis = (
            f"The batches already come from {ld.where()} and the step still waits {_ms(ld.data_s)} per step"
            f"{_per_sample(ld)} for the next one ({_ms(ld.ops_s)} of it in torch ops in the training process, "
            "the rest waiting on the workers' queue): the workers do not keep up."
        )
        change = (
            "Raise num_workers (up to the free cores) and prefetch_factor, keep them alive with "
            "persistent_workers=True (starting them counts in the first steps otherwise), and make the "
            "per-sample work cheaper (decode or tokenise once and cache the result, move tensor transforms to "
            "the device). If the samples are tensors already in memory, num_workers=0 can be faster: every "
            "batch crosses a process boundary."
        )
    else:
        diagnosis = (
            f"Loading is real work here, more than the DataLoader's own per-batch cost (under "
            f"{_ms(th.data_min_s)}): {_ms(ld.data_s)} per step{_per_sample(ld)} in the training process, "
            f"{_ms(ld.ops_s)} in torch ops (indexing, collate, tensor transforms) and {_ms(ld.python_s)} in "
            "Python (__getitem__, decoding, transforms, I/O)."
        )
        change = (
            "Load batches in worker processes and keep them alive: DataLoader(num_workers=4, "
            "persistent_workers=True, prefetch_factor=4, pin_memory=True on CUDA); move per-sample work out of "
            "collate_fn."
        )
    suggestion = f"{diagnosis} {integrations.fix(run.context, 'data_loading') or change}"
    return Finding(
        id="data_loading",
        title=f"Data loading takes {_pct(share)} % of each step: {_ms(ld.data_s)} per step",
        evidence=_loader_evidence(ev),
        suggestion=suggestion,
        predicted_effect=(
            f"step time ≈ {ev.step_s - ld.data_s:.4f} s (−{_pct(share)} %) once loading overlaps compute"
        ),
        formula="t_step' ≈ t_step − t_data (workers prepare the next batch while this one trains)",
        severity="critical" if share >= 0.5 else "warning",
    )


FUSE = (
    "use fewer Python-level ops (fuse them with torch.compile(model)), and on CUDA capture the step with "
    "CUDA graphs (torch.compile(mode='reduce-overhead'))"
)


def rule_overhead(ev: Evidence, th: Thresholds, run: Run) -> Finding | None:
    tiny_step = _tiny_step(ev, th)
    if not (tiny_step or _overhead(ev, th)):
        return None
    evidence = {
        "ops_per_step": round(ev.ops_per_step),
        "median_op_us": round(ev.median_op_us, 2),
        "heavy_op_pct": _pct(ev.heavy_op_share),
        "outside_ops_pct": _pct(ev.shares["untraced"]),
    }
    if not tiny_step:
        light = 1.0 - ev.heavy_op_share
        return Finding(
            id="overhead",
            title=f"Many tiny operators: {round(ev.ops_per_step)} per step, median {ev.median_op_us:.1f} µs",
            evidence=evidence,
            suggestion="The step is dominated by launch and Python overhead, not math: "
            + (integrations.fix(run.context, "overhead") or f"raise the batch size, {FUSE}."),
            predicted_effect=f"up to −{_pct(light)} % step time (the part not spent in substantial operators)",
            formula="t_step' ≈ t_step × heavy_op_share once fused; a k× larger batch costs ≈ the same overhead per step",
        )
    ld = ev.loader
    workers = (
        f" Its {ld.where()} already cost more than they save (every batch is pickled through a queue): "
        "num_workers=0 loads it in the training process without that IPC."
        if ld.in_workers
        else ""
    )
    fixed = min(1.0, ev.shares["data"] + ev.shares["untraced"])
    return Finding(
        id="overhead",
        title=(
            f"The step is tiny: {_ms(ev.step_s)} per step, so fixed per-step costs dominate it "
            f"(loading {_ms(ld.data_s)}, Python between ops {_pct(ev.shares['untraced'])} %)"
        ),
        evidence={**_loader_evidence(ev), **evidence},
        suggestion=(
            f"The data-loading share ({_pct(ev.shares['data'])} %) is high only because the step is tiny: "
            f"loading takes {_ms(ld.data_s)} per step{_per_sample(ld)} — the time of a few Python calls (the "
            "DataLoader's own per-batch work: sampler, indexing, collate), not slow collate, transforms or I/O. "
            "More workers would add IPC cost, not save time."
            + workers
            + " Make the step larger instead: "
            + (
                integrations.fix(run.context, "tiny_step")
                or f"raise the batch size so each step's fixed costs are shared by more samples, {FUSE}; for "
                "tensors already in memory, index a whole batch at once (x[idx]) instead of one __getitem__ "
                "per sample."
            )
        ),
        predicted_effect=(
            f"up to −{_pct(fixed)} % time per sample: the part of the step that is loading and Python between "
            "ops rather than the model's operators"
        ),
        formula="t_sample' ≥ (t_step − t_data − t_untraced) / B: a larger batch, fused ops or CUDA graphs shrink only the overhead",
        severity="info",
    )


def rule_attention(ev: Evidence, th: Thresholds, run: Run) -> Finding | None:
    t = ev.attention_seq
    if t < th.attention_seq:
        return None
    shape = ev.attention_shape
    heads_batch = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    per_matrix = heads_batch * t * t * 4
    evidence = {
        "seq_len": t,
        "score_shape": shape,
        "attention_calls_per_step": ev.attention_layers,
        "score_matrix_bytes": per_matrix,
    }
    sc = ev.scores
    if sc is not None:
        saved = sc.saved_bytes
        evidence.update(
            score_bytes_at_peak=sc.at_peak_bytes,
            score_tensors_kept_at_peak=sc.kept,
            score_temporaries_at_peak=sc.temporaries,
            peak_saved_bytes=saved,
        )
        which = (
            f"no [.., {t}, {t}] score or mask tensor is ever made ({sc.kept + sc.temporaries} of them, "
            f"{fmt_bytes(sc.at_peak_bytes)}, are alive at the peak now: {sc.kept} kept for backward, "
            f"{sc.temporaries} made in it)"
        )
        if saved < 0.99 * sc.at_peak_bytes:
            which += "; without them the step peaks elsewhere"
        formula = (
            "peak' ≈ the step's peak of (live bytes − bytes of [.., T, T] tensors), replayed from the trace's "
            "allocations: scores, probabilities, masks and their gradients are never materialised; flash keeps "
            "O(B·H·T)"
        )
    else:
        # no allocation events: probabilities saved by each layer and two gradient buffers
        # of the backward of one, as eager attention allocates them
        saved = per_matrix * (max(1, ev.attention_layers) + 2)
        evidence["peak_saved_bytes"] = saved
        which = (
            f"no [.., {t}, {t}] score matrix is ever made ({max(1, ev.attention_layers)} probability matrices "
            f"kept for backward and 2 temporaries in it, {fmt_bytes(saved)}; the trace has no allocations)"
        )
        formula = "saved ≈ (L + 2) × B·H × T² × 4 bytes: L probability matrices kept for backward, two gradient buffers in it"
    predicted = max(0.0, ev.peak_bytes - saved)
    evidence["predicted_peak_bytes"] = predicted
    effect = (
        f"peak tensor memory ≈ {fmt_bytes(predicted)} instead of {fmt_bytes(ev.peak_bytes)}: {which}"
        if ev.peak_bytes
        else f"≈ {fmt_bytes(saved)} less tensor memory at the peak: {which}"
    )
    return Finding(
        id="eager_attention",
        title=f"Explicit attention at sequence length {t}: score matrices grow as T²",
        evidence=evidence,
        suggestion="Use fused attention: "
        + (
            integrations.fix(run.context, "eager_attention")
            or "F.scaled_dot_product_attention (flash backend) instead of softmax(q @ k.T) @ v; for Hugging "
            "Face models attn_implementation='sdpa' or 'flash_attention_2'."
        ),
        toggle="flash_attention",
        predicted_effect=effect,
        formula=formula,
        severity="critical" if t >= 4 * th.attention_seq else "warning",
    )


def _category(ev: Evidence, name: str) -> float:
    fp = ev.footprint
    row = fp[fp["category"] == name]
    return float(row["at_peak_bytes"].iloc[0]) if len(row) else 0.0


def _blocks(ev: Evidence, run: Run) -> tuple[int, str]:
    """How many blocks repeat, and what says so: the attention calls per step in the
    trace (one per transformer block), else the run's context; 0 when nothing tells."""
    if ev.attention_calls > 1:
        return ev.attention_calls, "attention layers per step in the trace"
    for key in ("n_layer", "num_hidden_layers"):
        if run.context.get(key):
            return int(run.context[key]), f"run context {key}"
    return 0, ""


def checkpointed_peak(peak: float, activations: float, blocks: int, checkpointed: int | None = None) -> float:
    """Peak tensor bytes with ``checkpointed`` of ``blocks`` blocks checkpointed (all by
    default): their activations (≈ A/L each) are no longer kept, and backward recomputes one
    block at a time, holding its ≈ A/L activations again next to its backward temporaries,
    which the measured peak already holds among its other tensors."""
    blocks = max(1, blocks)
    checkpointed = blocks if checkpointed is None else min(checkpointed, blocks)
    return peak - activations * checkpointed / blocks + activations / blocks


def rule_activations(ev: Evidence, th: Thresholds, run: Run) -> Finding | None:
    act = _category(ev, "activations")
    if not ev.peak_bytes or act / ev.peak_bytes < th.activation_share:
        return None
    evidence = {
        "activations_bytes": act,
        "peak_bytes": ev.peak_bytes,
        "activations_pct": _pct(act / ev.peak_bytes),
    }
    blocks, source = _blocks(ev, run)
    if blocks > 1:
        predicted = checkpointed_peak(ev.peak_bytes, act, blocks)
        evidence.update(blocks=blocks, blocks_from=source, predicted_peak_bytes=predicted)
        effect = (
            f"peak tensor memory ≈ {fmt_bytes(predicted)} instead of {fmt_bytes(ev.peak_bytes)}: activations "
            f"≈ {fmt_bytes(act / blocks)} instead of {fmt_bytes(act)}, one of {blocks} blocks ({source}) "
            "recomputed at a time in backward (≈ +33 % compute)"
        )
    else:
        effect = (
            f"activations ≈ A/L instead of A = {fmt_bytes(act)} for L checkpointed blocks, one recomputed at "
            "a time in backward (≈ +33 % compute); the trace does not show how many blocks repeat"
        )
    formula = (
        "peak' ≈ peak − A + A/L: the L blocks keep only their inputs (small); backward recomputes one block at a "
        "time, its ≈ A/L activations alive again with its backward temporaries (already in the peak's other tensors)"
    )
    return Finding(
        id="activations",
        title=f"Activations are {_pct(act / ev.peak_bytes)} % of peak tensor memory",
        evidence=evidence,
        suggestion=integrations.fix(run.context, "activations")
        or (
            "Recompute activations in backward instead of keeping them: activation checkpointing on "
            "the repeated blocks (model.gradient_checkpointing_enable() for Hugging Face); free "
            "tensors you keep across steps (e.g. vision features)."
        ),
        toggle="grad_checkpointing",
        predicted_effect=effect,
        formula=formula,
    )


def _toggled(run: Run, toggle_id: str) -> bool:
    """Whether the run had ``toggle_id`` applied (its context's toggle reports)."""
    return any(isinstance(t, dict) and t.get("toggle") == toggle_id for t in run.context.get("toggles") or [])


def rule_fp32_activations(ev: Evidence, th: Thresholds, run: Run) -> Finding | None:
    """fp32 weights and a forward without mixed precision keeping a large share of the
    peak in activations: a Trainer or Accelerator whose mixed-precision setting is off, or
    a loop of its own whose matmuls ran on fp32 inputs (the trace's recorded input types);
    not a run with the bf16_autocast toggle applied."""
    rec = integrations.recorded(run.context)
    if run.context.get("dtype", "float32") != "float32" or _toggled(run, "bf16_autocast"):
        return None
    if rec is not None:
        if rec.mixed_precision() is not False:
            return None
        setting = (
            "bf16=False, fp16=False" if rec.is_trainer else f"mixed_precision={rec.get('mixed_precision')!r}"
        )
        mixed = f"off ({rec.cls}: {setting})"
    elif ev.matmul_types & FLOATING == {"float"}:  # a loop of its own: its matmuls ran on fp32 inputs
        mixed = "off (the matmuls' inputs in the trace are fp32)"
    else:
        return None
    act = _category(ev, "activations")
    if not ev.peak_bytes or act / ev.peak_bytes < th.fp32_activation_share:
        return None
    predicted = ev.peak_bytes - act / 2
    return Finding(
        id="fp32_activations",
        title=f"Activations are kept in fp32: {_pct(act / ev.peak_bytes)} % of peak tensor memory",
        evidence={
            "activations_bytes": act,
            "peak_bytes": ev.peak_bytes,
            "activations_pct": _pct(act / ev.peak_bytes),
            "weights_dtype": "float32",
            "mixed_precision": mixed,
            "predicted_peak_bytes": predicted,
        },
        suggestion=integrations.fix(run.context, "fp32_activations")
        or (
            "Run the forward pass under bf16 autocast (with torch.autocast('cuda', dtype=torch.bfloat16): …); "
            "try it without editing the cell: %%swift_profile --compare bf16_autocast"
        ),
        toggle="bf16_autocast",
        predicted_effect=(
            f"peak tensor memory ≈ {fmt_bytes(predicted)} instead of {fmt_bytes(ev.peak_bytes)}: activations "
            f"≈ {fmt_bytes(act / 2)} in bfloat16"
        ),
        formula=(
            "peak' ≈ peak − A/2: autocast keeps the activations saved for backward in 16 bits; weights, "
            "gradients and optimizer state stay fp32"
        ),
        severity="info",
    )


def rule_optimizer_state(ev: Evidence, th: Thresholds, run: Run) -> Finding | None:
    opt = _category(ev, "optimizer_state")
    if not ev.peak_bytes or opt / ev.peak_bytes < th.optimizer_share:
        return None
    shapes = run.context.get("matrix_shapes") or []
    if shapes:
        before = sum(2 * m * n for m, n in shapes) * 4
        after = (
            sum(
                2 * min(GALORE_RANK, min(m, n)) * max(m, n) + min(m, n) * min(GALORE_RANK, min(m, n))
                for m, n in shapes
            )
            * 4
        )
        effect = f"optimizer state of the 2-D weights ≈ {fmt_bytes(after)} instead of {fmt_bytes(before)}"
    else:
        effect = f"optimizer state ≈ ×{_galore_ratio(ev):.2f} for square d×d weights (rank {GALORE_RANK})"
    return Finding(
        id="optimizer_state",
        title=f"Optimizer state is {_pct(opt / ev.peak_bytes)} % of peak tensor memory",
        evidence={
            "optimizer_state_bytes": opt,
            "peak_bytes": ev.peak_bytes,
            "optimizer_pct": _pct(opt / ev.peak_bytes),
        },
        suggestion=integrations.fix(run.context, "optimizer_state")
        or (
            "Keep Adam's moments in a low-rank space: GaLore on the 2-D weight matrices "
            f"(rank {GALORE_RANK}, update_proj_gap=200), or an 8-bit optimizer."
        ),
        toggle="galore",
        predicted_effect=effect,
        formula="per m×n weight (m ≤ n): Adam state 2·m·n → 2·r·n + m·r (projection P is m×r)",
    )


def _galore_ratio(ev: Evidence) -> float:
    params = _category(ev, "parameters") / 4 or 1.0
    d = max(GALORE_RANK + 1, int(math.sqrt(params)))
    return (2 * GALORE_RANK * d + d * GALORE_RANK) / (2 * d * d)


def rule_sequence_parallel(ev: Evidence, th: Thresholds, run: Run) -> Finding | None:
    seq = int(run.context.get("seq_len") or ev.attention_seq or 0)
    if seq < th.long_seq or not ev.limit_bytes or ev.peak_bytes < th.near_limit * ev.limit_bytes:
        return None
    act = _category(ev, "activations")
    return Finding(
        id="sequence_parallel",
        title=f"Sequence length {seq} with memory at {_pct(ev.peak_bytes / ev.limit_bytes)} % of the device",
        evidence={
            "seq_len": seq,
            "peak_bytes": ev.peak_bytes,
            "limit_bytes": ev.limit_bytes,
            "activations_bytes": act,
        },
        suggestion=(
            "Split the sequence across ranks: Ulysses (all-to-all over heads, P ≤ 8) or Ring attention "
            "(K/V blocks passed around a ring, P ≤ 16, chunks of 512–1024 tokens)."
        ),
        toggle="sequence_parallel",
        predicted_effect=f"activations per rank ≈ {fmt_bytes(act / 4)} with P = 4",
        formula="A' ≈ A / P per rank; adds 4 all-to-alls per layer (Ulysses) or P−1 K/V transfers (Ring)",
        severity="critical",
    )


def rule_leak(ev: Evidence, th: Thresholds, run: Run) -> Finding | None:
    g = ev.growth_bytes_per_step
    if g < th.leak_bytes_per_step or (ev.peak_bytes and g < th.leak_share_per_step * ev.peak_bytes):
        return None
    return Finding(
        id="leak",
        title=f"Memory grows by {fmt_bytes(g)} every step",
        evidence={"growth_bytes_per_step": g, "measured_by": ev.growth_source, "peak_bytes": ev.peak_bytes},
        suggestion=(
            "Something keeps tensors of every step alive: accumulate Python numbers (loss.item()) not "
            "tensors, detach() what you log or store, and do not append outputs with their graph to lists."
        ),
        predicted_effect=f"out of memory after ≈ {_steps_to_limit(ev):,} more steps"
        if ev.limit_bytes
        else "",
        formula="steps_left ≈ (limit − peak) / growth per step",
        severity="critical",
    )


def _steps_to_limit(ev: Evidence) -> int:
    return max(0, int((ev.limit_bytes - ev.peak_bytes) / ev.growth_bytes_per_step))


def _grad_bytes(ev: Evidence, run: Run) -> tuple[float, str]:
    """Gradient bytes synchronised per step: the all-reduce payload measured in the trace
    (DDP), else the parameters × their element size."""
    comm = ev.comm
    if comm is not None and len(comm):
        ar = comm[comm["kind"] == "all_reduce"]["bytes_per_step"].sum()
        if ar > 0:
            return float(ar), "all-reduce payload in the trace"
        rs = comm[comm["kind"] == "reduce_scatter"]["bytes_per_step"].sum()
        if rs > 0:
            return float(rs), "reduce-scatter payload in the trace"
    params = float(run.context.get("params") or 0)
    size = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}.get(str(run.context.get("dtype")), 4)
    return params * size, "parameters × element size"


def rule_communication(ev: Evidence, th: Thresholds, run: Run) -> Finding | None:
    share = ev.exposed_comm_share
    if share < th.comm_share:
        return None
    p = max(ev.world_size, 2)
    grad, grad_source = _grad_bytes(ev, run)
    ring = (p - 1) / p
    now = 2 * ring * grad  # DDP's ring all-reduce of the gradients, each rank sends this
    fsdp_bf16 = 3 * ring * grad / 2  # all-gather (forward, backward) + reduce-scatter, bf16
    bf16 = now / 2
    bucket_mb = 25
    evidence = {
        "exposed_comm_pct": _pct(share),
        "exposed_comm_s_per_step": round(share * ev.step_s, 6),
        "collective_pct": _pct(ev.collective_share),
        "world_size": ev.world_size,
        "gradient_bytes": grad,
        "gradient_bytes_from": grad_source,
        "allreduce_wire_bytes_per_step": now,
    }
    framework = integrations.fix(run.context, "communication")
    lead = f". {framework} In a loop of your own: " if framework else ": "
    if ev.comm is not None and len(ev.comm):
        evidence["measured_wire_bytes_per_step"] = float(ev.comm["wire_bytes_per_step"].sum())
    fixes = [
        f"FSDP (fully_shard) with bf16 mixed precision (MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
        f"reduce_dtype=torch.bfloat16)): ≈ {fmt_bytes(fsdp_bf16)} sent per rank and step instead of "
        f"{fmt_bytes(now)} ({_pct(fsdp_bf16 / now - 1) if now else 0:+} %), and parameters, gradients and "
        "optimizer state sharded P ways",
        "or keep DDP and halve the bytes with a bf16 gradient hook "
        f"(ddp.register_comm_hook(None, bf16_compress_hook)): ≈ {fmt_bytes(bf16)} per step",
        f"DDP(bucket_cap_mb=…): the same {fmt_bytes(now)} in fewer, larger messages "
        f"(≈ {max(1, math.ceil(grad / (bucket_mb * 2**20)))} all-reduces of ≤ {bucket_mb} MB now; "
        "raise it when many small buckets each pay the latency)",
        "gradient accumulation with ddp.no_sync() on all but the last of k micro-batches: "
        f"{fmt_bytes(now)} per optimizer step instead of per micro-batch (÷k per sample)",
        f"DDP(gradient_as_bucket_view=True): bytes unchanged, saves one {fmt_bytes(grad)} gradient copy "
        "and the copy into the buckets",
    ]
    return Finding(
        id="communication",
        title=f"Exposed communication takes {_pct(share)} % of each step",
        evidence=evidence,
        suggestion=f"Reduce and overlap gradient synchronisation{lead}" + "; ".join(fixes) + ".",
        predicted_effect=(
            f"communicated bytes per step {fmt_bytes(now)} → {fmt_bytes(fsdp_bf16)} (FSDP + bf16) or "
            f"{fmt_bytes(bf16)} (bf16 hook); step time ≈ {ev.step_s * (1 - share / 2):.4f} s with half the bytes"
        ),
        formula=(
            "DDP ring all-reduce: 2·(P−1)/P × G bytes per rank; FSDP: all-gather twice + reduce-scatter, "
            "3·(P−1)/P × N × 2 bytes in bf16; t_comm' ≈ t_comm × bytes'/bytes"
        ),
        severity="critical" if share >= 0.5 else "warning",
    )


RULES = [
    rule_data_loading,
    rule_overhead,
    rule_attention,
    rule_activations,
    rule_fp32_activations,
    rule_optimizer_state,
    rule_sequence_parallel,
    rule_leak,
    rule_communication,
]
