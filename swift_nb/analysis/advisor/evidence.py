"""What the advisor's rules and verdict read: a run's numbers gathered once (medians over
the profiled steps), with the thresholds at which each rule fires."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from swift_nb.analysis.breakdown import PARTS as BREAKDOWN_PARTS
from swift_nb.analysis.comm import comm_shares
from swift_nb.analysis.device import (
    CAUSES,
    device_summary,
    device_work,
    idle_by_cause,
    kernels_by_kind,
    window_work,
)
from swift_nb.analysis.memory import memory_growth
from swift_nb.analysis.oom import Diagnosis, diagnosis_of
from swift_nb.analysis.operators import compiling_steps
from swift_nb.analysis.run_data import RunData, run_data
from swift_nb.analysis.scores import SDPA, ScoreMemory, eager_attention, score_memory
from swift_nb.analysis.tokens import Tokens
from swift_nb.analysis.trace.tables import Trace, per_name, per_value
from swift_nb.core import intervals
from swift_nb.core import trace_names as tn
from swift_nb.record import FINETUNE_KEY, STALE_MODELS_KEY, Run


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
    # a limit that keeps the GPU from computing this much of its window decides the verdict
    device_limit_share: float = 0.25
    # a finding's own part of the step (or of the GPU's window) below this is not raised
    min_part_share: float = 0.10
    # many small kernels: this many per step, with a median below this
    small_kernels_per_step: int = 500
    small_kernel_us: float = 20.0
    # compiling (torch.compile) that holds this much of the steps' time decides the verdict
    compile_share: float = 0.5
    # padding: this share of the tokens computed (0..1) is worth packing or grouping by length
    padding_share: float = 0.20
    # the loss's logits (B·T × V, with their log-softmax and gradient) holding this share of
    # the peak are worth a fused linear cross-entropy
    logits_share: float = 0.20


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


@dataclass(frozen=True)
class DeviceTime:
    """The GPU's window as ``swift_nb.analysis.device`` measures it: shares in percent,
    ``idle`` seconds by cause (``device.CAUSES``), ``kinds`` device seconds by kind of
    kernel, ``comm_exposed_s`` the communication kernels' seconds with no compute kernel
    beside them, ``collective`` the kind of collective taking most time (None: unknown)."""

    window_s: float
    idle_pct: float
    compute_pct: float
    non_compute_pct: float
    overlap_pct: float | None
    idle: dict[str, float]
    kinds: dict[str, float]
    comm_exposed_s: float = 0.0
    collective: str | None = None
    steps: int = 1  # profiled steps in the window
    kernels: int = 0
    kernel_median_us: float = 0.0
    pageable_copies: int = 0
    pageable_copy_s: float = 0.0
    simt_sgemm_s: float = 0.0  # fp32 GEMMs on the CUDA cores
    gemm_s: float = 0.0
    # synchronising runtime calls, by the operator that made them (aten::item: .item(), …),
    # and by the user's line around them (traces recorded with stacks)
    syncs: dict[str, int] = field(default_factory=dict)
    sync_sites: dict[str, int] = field(default_factory=dict)

    @property
    def idle_s(self) -> float:
        return sum(self.idle.values())

    def limits(self) -> dict[str, float]:
        """Seconds of the window each limit keeps the GPU from computing, by verdict kind:
        communication no compute hides (kernels alone and idle waiting for them), the host
        (launch gaps, synchronisation stalls, time outside its steps), data loading, and
        copies (running alone, or the host inside copy calls)."""
        idle = self.idle
        non_compute_s = self.non_compute_pct / 100 * self.window_s
        return {
            "communication-bound": self.comm_exposed_s + idle.get("comm_wait_s", 0.0),
            "overhead-bound": idle.get("host_bound_s", 0.0)
            + idle.get("sync_s", 0.0)
            + idle.get("other_s", 0.0),
            "data-bound": idle.get("data_s", 0.0),
            "copy-bound": idle.get("copy_s", 0.0) + max(0.0, non_compute_s - self.comm_exposed_s),
        }


@dataclass(frozen=True)
class Compiled:
    """What torch.compile did in the run (``swift_nb.capture.compile``).

    compile_s: seconds spent compiling, all steps; events: ``context["compile"]["events"]``
    (kind, step, seconds, reason, where …); steady_step_s: median duration of the steps that
    did not compile (s); steps / compiling_steps: steps recorded, and those that compiled;
    steps_s: the steps' summed duration, compiling included (s); eager_step_s: the same loop's
    median step without compile, when the run's context names one
    (``context["compile"]["eager_step_s"]``; None: unknown).
    """

    compile_s: float
    events: tuple[dict, ...]
    steady_step_s: float
    steps: int
    compiling_steps: int
    steps_s: float
    eager_step_s: float | None = None

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("kind") == kind]

    @property
    def share(self) -> float:
        """Part of the steps' time spent compiling, 0..1."""
        return self.compile_s / self.steps_s if self.steps_s > 0 else 0.0


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
    # the GPU's time, when the trace has device work (None: a CPU run)
    device: DeviceTime | None = None
    # torch.compile's work in the run (None: nothing compiled)
    compiled: Compiled | None = None
    # samples per batch as the run shows them (the context's batch_size, else the collate's
    # stack, else the model inputs in the trace; 0: unknown)
    batch: int = 0
    # where the run's tensors lived: "cuda" (device work or CUDA allocations in the trace) or "cpu"
    tensors_on: str = "cpu"
    # the tokens the model received (None: it received no token ids)
    tokens: Tokens | None = None
    # models alive in the kernel that the run neither trained nor ran (the summary's
    # stale_models: variable, class, bytes, device), the largest first
    stale_models: tuple[dict[str, Any], ...] = ()
    # an out-of-memory run's failed step: its need and the room (None: it did not run out)
    oom: Diagnosis | None = None

    @property
    def exposed_comm(self) -> float:
        """Part of the time, 0..1, that communication holds: of the GPU's window on a GPU
        run (kernels no compute hides, idle waiting for collectives), else of the step."""
        d = self.device
        if d is not None and d.window_s:
            return d.limits()["communication-bound"] / d.window_s
        return self.exposed_comm_share

    def at_peak(self, category: str) -> float:
        """Bytes of a memory category at the peak (0 when the footprint lacks it)."""
        fp = self.footprint
        row = fp[fp["category"] == category]
        return float(row["at_peak_bytes"].iloc[0]) if len(row) else 0.0


def applied(context: Mapping[str, Any], toggle_id: str) -> bool:
    """Whether the run had the toggle ``toggle_id`` applied (its context's toggle reports):
    a finding does not propose what the run already does."""
    return any(isinstance(t, Mapping) and t.get("toggle") == toggle_id for t in context.get("toggles") or [])


#: fine-tuning methods (``context["finetune"]["method"]``) that train LoRA adapters beside a
#: frozen base, and all those that train adapters only (low-rank or tiny)
LORA_METHODS = ("lora", "qlora", "dora")
ADAPTER_METHODS = (*LORA_METHODS, "ia3", "prefix", "prompt")


def finetune(context: Mapping[str, Any]) -> dict[str, Any]:
    """The run's fine-tuning (``context["finetune"]``, keys in ``swift_nb.record.finetune``);
    empty when the run did not record one."""
    found = context.get(FINETUNE_KEY)
    return dict(found) if isinstance(found, Mapping) else {}


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
    data: RunData | None = None,
) -> Evidence:
    """The numbers the rules read for ``run``. ``data``: the run's shared data
    (``run_data``) when the caller holds it; else it is derived here, from ``trace`` and
    ``breakdown`` when given."""
    th = thresholds or Thresholds()
    data = data if data is not None else run_data(run, trace, breakdown)
    trace, bd, ops = data.trace, data.breakdown, data.cpu_ops
    compiled = compiled_evidence(run)
    self_us = data.cpu_op_self_us
    n_steps = max(1, len(trace.steps))
    # Steps that compiled are apart from the steady ones: their tracing and code
    # generation is no part of what the step is bound by.
    compiling = compiling_steps(run)
    if not len(bd) or bd["step"].isin(compiling).all():
        compiling = set()  # every profiled step compiled: they are all there is to read
    if compiling:
        n_steps = max(1, len(set(trace.steps["step"]) - compiling)) if len(trace.steps) else n_steps
        bd = bd[~bd["step"].isin(compiling)]
        keep = ~ops["step"].isin(compiling)
        ops, self_us = ops[keep], self_us[keep]
    step_s = float(bd["step_s"].median()) if len(bd) else float("nan")
    # of the steps' summed time: the shares add up to 100 % (medians per part would not)
    total_s = float(bd["step_s"].sum()) if len(bd) else 0.0
    shares = {
        c.removesuffix("_s"): float(bd[c].sum()) / total_s if total_s > 0 else 0.0 for c in BREAKDOWN_PARTS
    }
    ops_per_step = len(ops) / n_steps
    median_op_us = float(self_us.median()) if len(ops) else float("nan")
    spans = trace.steps[~trace.steps["step"].isin(compiling)] if compiling else trace.steps
    span_us = float(spans["dur_us"].sum()) if len(spans) else 0.0
    heavy = float(self_us[self_us >= th.tiny_op_us].sum() / span_us) if span_us else 0.0
    seq, shape, layers = eager_attention(ops, n_steps)
    sdpa = int(ops["name"].eq(SDPA).sum())
    fp = data.footprint
    peak = float(fp["at_peak_bytes"].sum()) if len(fp) else float(run.summary.get("peak_mem_bytes") or 0.0)
    growth, source = memory_growth(run)
    collective_share, exposed_comm_share = comm_shares(data.comm_per_step)
    loader = _loader(trace, bd, ops, run, data.traced_batch_and_seq[0])
    return Evidence(
        collective_share=collective_share,
        exposed_comm_share=exposed_comm_share,
        world_size=data.world_size,
        comm=data.collectives,
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
        scores=score_memory(trace, ops) if seq else None,
        footprint=fp,
        peak_bytes=peak,
        limit_bytes=th.memory_limit_bytes if th.memory_limit_bytes is not None else _device_limit(run),
        growth_bytes_per_step=growth,
        growth_source=source,
        loader=loader,
        matmul_types=_matmul_types(ops),
        device=device_time(trace, data.collectives, data.device_work),
        compiled=compiled,
        batch=loader.samples or _batch_samples([], run, data.traced_batch_and_seq[0]),
        tensors_on=_tensors_on(run, trace, data.device_work),
        tokens=Tokens.of(run),
        stale_models=tuple(
            dict(m) for m in run.summary.get(STALE_MODELS_KEY) or () if isinstance(m, Mapping)
        ),
        oom=diagnosis_of(run),
    )


def compiled_evidence(run: Run) -> Compiled | None:
    """torch.compile's work in ``run`` as the rules read it (None: nothing compiled)."""
    found = run.context.get("compile")
    compile_s = float(run.summary.get("compile_s") or 0.0)
    if not isinstance(found, dict) or (not found.get("events") and compile_s <= 0):
        return None
    steps = run.steps
    dur = pd.to_numeric(steps["duration_s"], errors="coerce") if len(steps) else pd.Series(dtype=float)
    compiling = compiling_steps(run)
    steady = dur[~steps["step"].isin(compiling)].dropna() if len(steps) else dur
    eager = found.get("eager_step_s")
    return Compiled(
        compile_s=compile_s,
        events=tuple(e for e in found.get("events", ()) if isinstance(e, dict)),
        steady_step_s=float(steady.median()) if len(steady) else float("nan"),
        steps=int(run.summary.get("steps") or len(steps)),
        compiling_steps=len(compiling),
        steps_s=float(dur.sum()) if len(dur) else 0.0,
        eager_step_s=float(eager) if eager else None,
    )


def device_time(
    trace: Trace, collectives: pd.DataFrame | None = None, work: pd.DataFrame | None = None
) -> DeviceTime | None:
    """The GPU's window of ``trace`` (None without device work); ``collectives``: the
    run's collectives by kind (``analysis.comm``), to name the one taking most time."""
    work = work if work is not None else device_work(trace)
    summary = device_summary(trace, work=work)
    if summary.get("device_idle_pct") is None:
        return None
    idle = idle_by_cause(trace, work=work)
    kinds = kernels_by_kind(trace, work=work)
    by_kind = dict(zip(kinds["kind"].astype(str), kinds["time_s"].astype(float), strict=True))
    overlap = summary.get("comm_compute_overlap_pct")
    comm_s = by_kind.get("communication", 0.0)
    collective = None
    if collectives is not None and len(collectives) and "time_s_per_step" in collectives:
        collective = str(collectives.sort_values("time_s_per_step", ascending=False)["kind"].iloc[0])
    syncs, sites = _sync_callers(trace)
    # the same window as the figures above: its kernels, copies and steps
    chosen = window_work(trace, work)
    dur_us = (chosen["end_us"] - chosen["ts_us"]).to_numpy()
    names = chosen["name"]  # as they are: a copy into text would cost more than the questions
    is_kernel = ~chosen["kind"].isin(("memcpy", "memset")).to_numpy()
    # once per distinct name: a job's traces hold 10^5 kernels of a few hundred names
    pageable = per_value(names, lambda n: isinstance(n, str) and tn.PAGEABLE_COPY.search(n) is not None)
    simt = per_value(names, lambda n: isinstance(n, str) and tn.SIMT_SGEMM.search(n) is not None)
    steps = chosen.loc[chosen["step"] >= 0, "step"].nunique()
    return DeviceTime(
        steps=max(1, steps),
        kernels=int(is_kernel.sum()),
        kernel_median_us=float(np.median(dur_us[is_kernel])) if is_kernel.any() else 0.0,
        pageable_copies=int(pageable.sum()),
        pageable_copy_s=float(dur_us[pageable].sum()) / 1e6,
        simt_sgemm_s=float(dur_us[simt].sum()) / 1e6,
        gemm_s=float(dur_us[(chosen["kind"] == "gemm").to_numpy()].sum()) / 1e6,
        syncs=syncs,
        sync_sites=sites,
        window_s=float(summary["window_s"]),
        idle_pct=float(summary["device_idle_pct"]),
        compute_pct=float(summary["device_compute_pct"]),
        non_compute_pct=float(summary["device_non_compute_pct"]),
        overlap_pct=None if overlap is None else float(overlap),
        idle={c: float(idle[c].iloc[0]) for c in CAUSES} if len(idle) else {},
        kinds=by_kind,
        comm_exposed_s=comm_s * (1 - (overlap or 0.0) / 100),
        collective=collective,
    )


def _loader(trace: Trace, bd: pd.DataFrame, ops: pd.DataFrame, run: Run, traced_batch: int | None) -> Loader:
    """What the ``enumerate(DataLoader)`` spans of the profiled steps hold (``ops``: the
    steps' cpu ops; ``traced_batch``: the batch the model's inputs show)."""
    ev = trace.events
    spans = ev[(ev["step"] >= 0).to_numpy() & per_name(trace, lambda n: tn.DATA.search(n) is not None)]
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
        ops_s[step] = (
            ops_s.get(step, 0.0) + intervals.length(intervals.union(inside["ts_us"], inside["end_us"])) / 1e6
        )
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
        samples=_batch_samples(samples, run, traced_batch),
        in_workers=in_workers,
        num_workers=num_workers,
    )


def _batch_samples(collated: list[int], run: Run, traced_batch: int | None) -> int:
    """Samples per batch: as the run's context says, else how many tensors the collate
    stacked (the profiler leaves long lists' shapes out), else the batch the model's
    inputs show; 0 when nothing tells."""
    if run.context.get("batch_size"):
        return int(run.context["batch_size"])
    if collated:
        return int(np.median(collated))
    return traced_batch or 0


def _tensors_on(run: Run, trace: Trace, work: pd.DataFrame) -> str:
    """``cuda`` when the trace has device work or the run's allocations were on a GPU, else ``cpu``."""
    if len(work):
        return "cuda"
    memory = trace.memory
    on_gpu = bool(len(memory)) and bool((memory["device_type"] == 1).any())
    return "cuda" if run.environment.get("device") == "cuda" and on_gpu else "cpu"


def _device_limit(run: Run) -> float | None:
    """Memory capacity of the device the tensors live on (bytes)."""
    cols = [c for c in run.samples.columns if c.startswith("gpu") and c.endswith("_mem_total_bytes")]
    if cols:
        return float(pd.to_numeric(run.samples[cols[0]], errors="coerce").max())
    if run.environment.get("device") == "cpu":
        return run.environment.get("mem_total_bytes")
    return None


#: a Python frame of the user's code in a trace recorded with stacks: ``train.py(42): step``,
#: not a library's (site-packages, torch, the standard library)
_USER_FRAME = re.compile(
    r"^(?!.*(?:site-packages|dist-packages|/torch/|/lib/python\d|<built-in)).+\.py\(\d+\)"
)


def _innermost(spans: tuple[np.ndarray, np.ndarray, np.ndarray] | None, ts: float) -> str | None:
    """The name of the latest-starting span that holds ``ts`` (None: none does)."""
    if spans is None:
        return None
    starts, ends, names = spans
    last = int(np.searchsorted(starts, ts, side="right"))
    holding = np.flatnonzero(ends[:last] >= ts)
    return str(names[holding[-1]]) if len(holding) else None


def _sync_callers(trace: Trace) -> tuple[dict[str, int], dict[str, int]]:
    """Synchronising runtime calls in the profiled steps, by the innermost operator that
    made each on its thread (``aten::item``, ``aten::nonzero``, ``aten::_to_copy`` …; the
    call itself when no operator encloses it), and by the innermost frame of the user's
    code around it (``train.py(42): step``) where the trace has Python stacks."""
    ev = trace.events
    sync = np.flatnonzero(
        per_name(trace, lambda n: tn.SYNC.match(n) is not None) & (ev["step"] >= 0).to_numpy()
    )
    if not len(sync):
        return {}, {}
    # arrays, and only the threads that synchronise: a copy of the operators' rows would
    # hold most of the table again
    ts, ends = ev["ts_us"].to_numpy(), ev["end_us"].to_numpy()
    names, tids = ev["name"].to_numpy(dtype=object), ev["tid"].to_numpy()
    cats = ev["cat"].to_numpy(dtype=object)
    ops = cats == "cpu_op"
    frames = (cats == "python_function") & per_name(trace, lambda n: bool(_USER_FRAME.match(n)))
    callers: dict[str, int] = {}
    sites: dict[str, int] = {}
    threads = list(dict.fromkeys(tids[sync]))
    for among, found, fallback in ((ops, callers, True), (frames, sites, False)):
        by_tid = {}
        for tid in threads:
            rows = np.flatnonzero(among & (tids == tid))
            if len(rows):
                rows = rows[np.argsort(ts[rows], kind="stable")]
                by_tid[tid] = (ts[rows], ends[rows], names[rows])
        for i in sync:
            key = _innermost(by_tid.get(tids[i]), ts[i])
            key = key if key is not None else (str(names[i]) if fallback else None)
            if key is not None:
                found[key] = found.get(key, 0) + 1
    return (
        dict(sorted(callers.items(), key=lambda kv: -kv[1])),
        dict(sorted(sites.items(), key=lambda kv: -kv[1])),
    )
