"""Will it fit? The peak tensor memory of a training step at another batch size, sequence
length, dtype, optimizer, toggle set, world size or device, scaled from what a run measured.

What scales how (per rank; B samples of T tokens):
- parameters, gradients and optimizer state: exactly, from the parameter count and the bytes
  per element (fp32 4, bf16/fp16 2), the optimizer's states per parameter (Adam/AdamW 2,
  SGD with momentum 1, without 0, 8-bit Adam 2 of 1 byte, Adafactor factored, GaLore's
  low-rank moments) and ZeRO/FSDP sharding. Gradients count as many as were alive at the
  measured peak (backward frees activations while it makes gradients).
- activations and other tensors: linear in B·T, plus the [.., T, T] tensors of an eager
  attention (scores, probabilities, masks and their gradients), which grow as B·T². One run
  cannot tell the two apart from its totals: the trace's allocations can (tensors of a
  softmax's [.., T, T] shape made by ops on such tensors), and a ``calibration`` run at another batch size or sequence length fits
  them from two points.
- the whole step: the run's memory timeline is scaled point by point and its maximum taken,
  so a peak that moves (from backward to the optimizer step when activations shrink) is
  found where it moves to.

``forecast(run, "H100-80GB", batch_size=32, seq_len=4096, dtype="bf16")`` returns a
``Forecast``: bytes by category, the device's room (capacity less the CUDA context), whether
it fits, the headroom, the largest batch and sequence that fit, and the derivation of every
number in words.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from html import escape
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from swift_nb import trace_names as tn
from swift_nb.analysis.advisor import (
    GALORE_RANK,
    SDPA,
    _eager_attention,
    _square_inputs,
    _square_sizes,
    checkpointed_peak,
)
from swift_nb.analysis.memory import memory_footprint
from swift_nb.analysis.shapes import input_dims
from swift_nb.analysis.throughput import batch_and_seq
from swift_nb.analysis.trace import Trace, load_trace, parse_events
from swift_nb.errors import ConfigError, RecordError
from swift_nb.record import MEMORY_CATEGORIES, Run
from swift_nb.units import fmt_bytes

MIB = 1 << 20
GIB = 1 << 30

#: Outside torch's allocator, a process that has initialised CUDA, cuBLAS and cuDNN holds
#: the CUDA context, its loaded kernels and the libraries' handles: nvidia-smi's figure for
#: the process minus torch.cuda.memory_reserved(). With torch 2.x on CUDA 12, whose lazy
#: module loading (the default since 11.7) loads only the kernels a process uses, that is
#: commonly 0.4–0.6 GiB on Ampere and Hopper GPUs (1–2 GiB with CUDA_MODULE_LOADING=EAGER
#: or CUDA 11); 512 MiB is the estimate used here, also for a capacity given as a number.
CUDA_CONTEXT_BYTES = 512 * MIB
#: ROCm's runtime and its BLAS workspaces: no published figure; an estimate.
ROCM_CONTEXT_BYTES = 1 * GIB


class Device(NamedTuple):
    """A GPU: ``capacity_bytes`` as ``torch.cuda.get_device_properties(i).total_memory``
    reports it (NVIDIA's "80 GB" are decimal, and part of it is reserved by the driver),
    ``context_bytes`` what the CUDA context takes of it, ``source`` where the numbers come from."""

    name: str
    capacity_bytes: int
    context_bytes: int
    source: str


def _reported(mib: int, where: str) -> str:
    return f"total_memory {mib:,} MiB as torch reports it ({where}); the driver's figure moves by ~0.5 %"


#: The presets of ``forecast(device=...)``: total_memory as torch printed it in public logs
#: (``torch.cuda.get_device_properties`` or Ultralytics' ``CUDA:0 (name, N MiB)``, which is
#: total_memory / 2**20) with recent drivers; the context as ``CUDA_CONTEXT_BYTES`` says.
DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device(
            "A100-40GB",
            40441 * MIB,
            CUDA_CONTEXT_BYTES,
            _reported(40441, "A100-SXM4-40GB, torch 2.11, CUDA 12.8"),
        ),
        Device(
            "A100-80GB",
            81153 * MIB,
            CUDA_CONTEXT_BYTES,
            _reported(81153, "A100-SXM4-80GB, torch 2.7, CUDA 12.6"),
        ),
        Device(
            "H100-80GB", 81559 * MIB, CUDA_CONTEXT_BYTES, _reported(81559, "H100 80GB HBM3, 85,520,809,984 B")
        ),
        Device(
            "H100-94GB", 95320 * MIB, CUDA_CONTEXT_BYTES, _reported(95320, "H100 NVL, torch 2.13, CUDA 13.0")
        ),
        Device(
            "H200-141GB", 143156 * MIB, CUDA_CONTEXT_BYTES, _reported(143156, "H200, torch 2.11, CUDA 12.8")
        ),
        Device("L4-24GB", 22563 * MIB, CUDA_CONTEXT_BYTES, _reported(22563, "L4, torch 2.11, CUDA 12.8")),
        Device("A10G-24GB", 22587 * MIB, CUDA_CONTEXT_BYTES, _reported(22587, "A10G")),
        Device("RTX4090-24GB", 24563 * MIB, CUDA_CONTEXT_BYTES, _reported(24563, "GeForce RTX 4090")),
        Device("V100-16GB", 16160 * MIB, CUDA_CONTEXT_BYTES, _reported(16160, "V100-SXM2-16GB")),
        Device("V100-32GB", 32494 * MIB, CUDA_CONTEXT_BYTES, _reported(32494, "V100-SXM2-32GB, torch 2.6")),
        Device(
            "T4-16GB", 15095 * MIB, CUDA_CONTEXT_BYTES, _reported(15095, "Tesla T4, torch 2.6, CUDA 12.4")
        ),
        Device("MI300X-192GB", 196592 * MIB, ROCM_CONTEXT_BYTES, _reported(196592, "MI300X, ROCm")),
    )
}

#: bytes per element of each dtype a forecast takes, and the names it takes them by.
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
DTYPE_NAMES = {
    **{d: d for d in DTYPE_BYTES},
    "fp64": "float64",
    "double": "float64",
    "fp32": "float32",
    "float": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
}


class OptimizerState(NamedTuple):
    """Per parameter element: ``states`` tensors, each element ``element_bytes`` (None:
    as the parameters'); ``factored``: Adafactor's row and column second moments."""

    states: int
    element_bytes: int | None = None
    factored: bool = False


#: Optimizer classes by name (``run.context["optimizer"]``); a run that used SGD says itself
#: whether it kept momentum (its measured state), any other is taken with momentum.
OPTIMIZERS: dict[str, OptimizerState] = {
    **dict.fromkeys(
        ("Adam", "AdamW", "NAdam", "RAdam", "Adamax", "GaLoreAdamW", "Adadelta"), OptimizerState(2)
    ),
    **dict.fromkeys(("SGD", "RMSprop", "Adagrad"), OptimizerState(1)),
    **dict.fromkeys(("Adam8bit", "AdamW8bit", "PagedAdam8bit", "PagedAdamW8bit"), OptimizerState(2, 1)),
    "Adafactor": OptimizerState(1, None, factored=True),
}
ADAM_LIKE = ("Adam", "AdamW", "GaLoreAdamW")


#: The toggles a forecast understands, with their parameters' defaults:
#: flash_attention: fused attention, no [.., T, T] tensors; grad_checkpointing: the
#: activations of every_n-th block recomputed in backward; galore: Adam's moments of the
#: weight matrices in rank r; sequence_parallel: each rank holds T / sp_size tokens;
#: bf16_autocast: bf16 activations, fp32 parameters, gradients and optimizer state;
#: zero: optimizer state (stage 1), + gradients (2), + parameters (3) sharded over the
#: ranks; fsdp: ZeRO stage 3.
TOGGLES: dict[str, dict[str, int]] = {
    "flash_attention": {},
    "grad_checkpointing": {"every_n": 1},
    "galore": {"rank": GALORE_RANK},
    "sequence_parallel": {"sp_size": 2},
    "bf16_autocast": {},
    "zero": {"stage": 1},
    "fsdp": {},
}
_ALIASES = {"n": "every_n", "sp": "sp_size", "r": "rank"}

#: How far off the total is expected to be (± %). Forecasts of another batch, sequence,
#: dtype or optimizer came within 0.5 % of the measured peak in benchmarks/forecast.py
#: (four models on CPU, 4× the batch, 2× the sequence, bf16, SGD); 5 % leaves room for what a
#: CPU run does not show (the CUDA allocator's 512-byte rounding, cuBLAS and cuDNN
#: workspaces). Each toggle adds what it was off there, rounded up, or what its assumption
#: costs where the benchmark could not measure it.
ERROR_BASE_PCT = 5.0
ERROR_ADDED_PCT = {
    "flash_attention": 5.0,  # benchmark: −4.1 % and −6.6 % (the fused kernel's own buffers)
    "grad_checkpointing": 5.0,  # benchmark: +5.9 % and +5.8 % (blocks taken as equal)
    "bf16_autocast": 15.0,  # which ops autocast keeps in fp32 differs by model and device
    "sequence_parallel": 10.0,  # communication buffers and the attention's own layout
    "zero": 5.0,  # gathered and bucketed copies
    "fsdp": 10.0,
}
ERROR_NO_TRACE_PCT = 10.0  # [.., T, T] tensors unseen: a longer sequence scaled linearly
ERROR_FAR_PCT = 5.0  # more than 16× the run's tokens per step
SEARCH_LIMIT = 1 << 24  # largest batch or sequence the search for the maximum tries


# -- arguments ---------------------------------------------------------------------------


def resolve_device(device: str | float) -> Device:
    """A preset by name (case and dashes ignored; a unique prefix such as ``"A10G"`` will do),
    a capacity in bytes, or a string ``"80GB"`` (decimal) / ``"24GiB"`` (binary)."""
    if isinstance(device, (int, float)) and not isinstance(device, bool):
        if not device > 0:
            raise ConfigError("device", "must be a positive number of bytes", device)
        return _custom(float(device), f"{int(device):,} bytes as given")
    text = str(device).strip()
    size = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?", text, flags=re.IGNORECASE)
    if size:
        unit = (size.group(2) or "B").upper().replace("IB", "iB")
        scale = {"B": 1, **{f"{p}B": 1000**i for i, p in enumerate("KMGT", 1)}}
        scale.update({f"{p}iB": 1024**i for i, p in enumerate("KMGT", 1)})
        return _custom(float(size.group(1)) * scale[unit], f"{text} as given")

    def key(name: str) -> str:
        return re.sub(r"[\s_-]", "", name).lower()

    wanted = key(text)
    found = [d for d in DEVICES.values() if key(d.name) == wanted]
    if not found and wanted:
        found = [d for d in DEVICES.values() if key(d.name).startswith(wanted)]
    if len(found) == 1:
        return found[0]
    raise ConfigError(
        "device",
        f"must be one of {', '.join(DEVICES)}, a number of bytes or a capacity such as 80GB or 24GiB",
        device,
    )


def _custom(capacity: float, source: str) -> Device:
    return Device(f"{fmt_bytes(capacity)} device", int(capacity), CUDA_CONTEXT_BYTES, source)


def dtype_name(dtype: str) -> str:
    """``"bf16"`` → ``"bfloat16"``; ``ConfigError`` for a dtype a forecast does not know."""
    name = DTYPE_NAMES.get(str(dtype).strip().lower().removeprefix("torch."))
    if name is None:
        raise ConfigError("dtype", f"must be one of {', '.join(DTYPE_NAMES)}", dtype)
    return name


def parse_toggles(
    toggles: str | Iterable[str] | Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[str, int]]:
    """``["galore:rank=64", "flash_attention"]`` (or ``"galore:rank=64,flash_attention"``,
    or ``{"galore": {"rank": 64}}``) → ``{"galore": {"rank": 64}, "flash_attention": {}}``,
    each toggle's parameters completed with their defaults."""
    if isinstance(toggles, Mapping):
        items = [(str(k), {str(p): v for p, v in (v or {}).items()}) for k, v in toggles.items()]
    else:
        specs = _split_toggles(toggles.split(",") if isinstance(toggles, str) else list(toggles))
        items = [_toggle_item(s) for s in specs]
    out: dict[str, dict[str, int]] = {}
    for name, given in items:
        defaults = TOGGLES.get(name)
        if defaults is None:
            raise ConfigError("toggles", f"must be among {', '.join(TOGGLES)}", name)
        values = dict(defaults)
        for param, value in given.items():
            param = _ALIASES.get(param, param)
            if param not in defaults:
                takes = ", ".join(defaults) or "no parameters"
                raise ConfigError(f"toggle {name}", f"takes {takes}", param)
            values[param] = _whole(f"{name}:{param}", value)
        _check_toggle(name, values)
        out[name] = values
    return out


def _split_toggles(parts: list[str]) -> list[str]:
    """Comma-separated toggles whose own parameters are comma-separated too
    (``galore:rank=64,gap=2``): a ``key=value`` without a toggle name belongs to the one before."""
    specs: list[str] = []
    for part in (p.strip() for p in parts):
        if not part:
            continue
        if "=" in part and ":" not in part and specs:
            specs[-1] += "," + part
        else:
            specs.append(part)
    return specs


def _toggle_item(spec: str) -> tuple[str, dict[str, str]]:
    name, _, params = spec.partition(":")
    given = {}
    for item in filter(None, (p.strip() for p in params.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"toggle {name.strip()}", "parameters are key=value", item)
        given[key.strip()] = value.strip()
    return name.strip(), given


def _whole(name: str, value: Any) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not number.is_integer():
        raise ConfigError(name, "must be a whole number", value)
    return int(number)


def _check_toggle(name: str, values: dict[str, int]) -> None:
    for param, value in values.items():
        if value < 1:
            raise ConfigError(f"{name}:{param}", "must be at least 1", value)
    if name == "sequence_parallel" and values["sp_size"] < 2:
        raise ConfigError("sequence_parallel:sp_size", "must be at least 2", values["sp_size"])
    if name == "zero" and values["stage"] not in (1, 2, 3):
        raise ConfigError("zero:stage", "must be 1, 2 or 3", values["stage"])


def parse_forecast_spec(text: str) -> dict[str, Any]:
    """The keyword arguments of ``forecast`` from a line such as
    ``"H100-80GB batch=32 seq=4096 dtype=bf16 toggles=flash_attention,galore:rank=64"``:
    the device first (optional), then ``key=value`` words: batch (batch_size), seq (seq_len),
    dtype, optimizer, world (world_size), toggles. Every value is checked here."""
    words = str(text).split()
    out: dict[str, Any] = {}
    if words and "=" not in words[0]:
        out["device"] = _spec_value("device", words.pop(0))
    keys = {
        "batch": "batch_size",
        "batch_size": "batch_size",
        "seq": "seq_len",
        "seq_len": "seq_len",
        "dtype": "dtype",
        "optimizer": "optimizer",
        "world": "world_size",
        "world_size": "world_size",
        "toggles": "toggles",
        "device": "device",
    }
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or key not in keys:
            raise ConfigError(
                "forecast",
                "takes a device, then key=value words among batch, seq, dtype, optimizer, world, toggles "
                "(e.g. 'H100-80GB batch=32 seq=4096 dtype=bf16 toggles=flash_attention')",
                word,
            )
        out[keys[key]] = _spec_value(keys[key], value)
    return out


def _is_size(word: str) -> bool:
    return bool(re.fullmatch(r"\d+(?:\.\d+)?\s*([KMGT]i?B|B)?", word, flags=re.IGNORECASE))


def _spec_value(key: str, value: str) -> Any:
    if key in ("batch_size", "seq_len", "world_size"):
        number = _whole(key, value)
        if number < 1:
            raise ConfigError(key, "must be at least 1", value)
        return number
    if key == "dtype":
        return dtype_name(value)
    if key == "toggles":
        parse_toggles(value)
        return tuple(_split_toggles(value.split(",")))
    if key == "device":
        return value if _is_size(value) else resolve_device(value).name
    return value


# -- what the run measured ---------------------------------------------------------------


@dataclass
class ScoreBytes:
    """The [.., T, T] tensors of an eager attention alive at the step's peak, in bytes:
    ``per_sample`` ones grow with the batch ([B, H, T, T] scores, probabilities, their
    gradients), ``batch_free`` ones do not (a [T, T] mask); each as activations (kept for
    backward) and other (made in backward)."""

    activations_per_sample: float = 0.0
    activations_batch_free: float = 0.0
    other_per_sample: float = 0.0
    other_batch_free: float = 0.0

    def of(self, category: str) -> tuple[float, float]:
        return getattr(self, f"{category}_per_sample"), getattr(self, f"{category}_batch_free")


#: The columns of ``Measured.timeline``: the weights' categories, then activations and
#: other each split into the rest, [.., T, T] tensors per sample and batch-free ones.
PARTS = [
    "parameters",
    "gradients",
    "optimizer_state",
    "activations_rest",
    "activations_per_sample",
    "activations_batch_free",
    "other_rest",
    "other_per_sample",
    "other_batch_free",
]


@dataclass
class Measured:
    """What one run measured, as a forecast reads it.

    categories: bytes at the recorded steps' peak (median); scores: its [.., T, T] tensors
    at that peak; timeline: bytes of each of ``PARTS`` over the median recorded step, one
    row per point of its memory timeline, the peak's row first; batch_size, seq_len: its
    shape (None: unknown); dtype / element_bytes of its parameters; params: their count;
    matrices: the m×n weights of its linear layers (from the trace) with how many of each;
    blocks: its repeated blocks (attention layers in the trace, or the context), hidden:
    the model width; traced: whether the trace holds its allocations (without them,
    [.., T, T] tensors cannot be told apart); untracked_bytes: how much more the step's
    peak held than its categories (CUDA's allocator counts tensors the profiler never saw
    allocated: buffers, caches, the batch made before recording began); notes: what could not be read and what was
    assumed."""

    run_id: str
    categories: dict[str, float]
    timeline: np.ndarray
    batch_size: int | None
    seq_len: int | None
    dtype: str
    element_bytes: int
    params: int
    optimizer: str | None
    world_size: int
    scores: ScoreBytes
    matrices: dict[tuple[int, int], int]
    blocks: int
    blocks_from: str
    hidden: int | None
    toggles: set[str]
    traced: bool = True
    untracked_bytes: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return float(sum(self.categories.values()))


_CATEGORY_COLUMNS = [f"{c}_bytes" for c in MEMORY_CATEGORIES]


def _recorded_steps(run: Run) -> pd.DataFrame:
    """The steps with memory categories, as ``memory_footprint`` takes them: those that
    follow another recorded step where there are such."""
    steps = run.steps
    if not set(_CATEGORY_COLUMNS) <= set(steps.columns):
        return steps.iloc[0:0]
    recorded = steps.dropna(subset=_CATEGORY_COLUMNS)
    followers = recorded[recorded["step"].isin(recorded["step"] + 1)]
    return followers if len(followers) else recorded


def measure(run: Run, trace: Trace | None = None) -> Measured:
    """What ``run`` measured that a forecast scales; ``ConfigError`` when it has no memory
    categories (recorded without ``profile_memory`` or with no recorded step)."""
    recorded = _recorded_steps(run)
    footprint = memory_footprint(run)
    if recorded.empty or footprint.empty:
        raise ConfigError(
            "run",
            "has no memory by category: profile with profile_memory=True so at least one step is "
            "recorded (schedule active ≥ 1, and at least wait + warmup + active steps)",
            run.id,
        )
    notes: list[str] = []
    if trace is None:
        try:
            trace = load_trace(run)
        except RecordError as e:
            notes.append(f"the trace could not be read ({e.problem}): shapes and attention scores unknown")
            trace = parse_events([])
    categories = dict(zip(MEMORY_CATEGORIES, footprint["at_peak_bytes"].astype(float), strict=True))
    totals = recorded[_CATEGORY_COLUMNS].sum(axis=1)
    median_step = int(recorded.loc[(totals - totals.median()).abs().idxmin(), "step"])
    ctx = run.context
    batch, seq = ctx.get("batch_size"), ctx.get("seq_len")
    if batch is None or seq is None:
        found_batch, found_seq = batch_and_seq(trace.events)
        batch = batch if batch is not None else found_batch
        seq = seq if seq is not None else found_seq
    dtype, element_bytes, params = _parameters(ctx, categories["parameters"], notes)
    ops = trace.events[(trace.events["cat"] == "cpu_op") & (trace.events["step"] >= 0)]
    blocks, blocks_from = _blocks(ops, trace, ctx)
    if trace.memory.empty and seq:
        notes.append(
            "the trace holds no allocations: attention's [.., T, T] tensors cannot be told apart, so activations "
            "scale linearly with tokens (a calibration run at another sequence length fits a quadratic part)"
        )
    scores = _Scores(trace, ops, _device_type(run, trace), int(batch or 1))
    at_peak = ScoreBytes(*np.median([scores.at_peak(int(k)) for k in recorded["step"]], axis=0).tolist())
    return Measured(
        run_id=run.id,
        categories=categories,
        timeline=_timeline(run, trace, median_step, categories, at_peak, scores),
        batch_size=int(batch) if batch else None,
        seq_len=int(seq) if seq else None,
        dtype=dtype,
        element_bytes=element_bytes,
        params=params,
        optimizer=ctx.get("optimizer"),
        world_size=int(ctx.get("world_size") or run.environment.get("world_size") or 1),
        scores=at_peak,
        matrices=_matrices(trace, ops, median_step),
        blocks=blocks,
        blocks_from=blocks_from,
        hidden=_hidden(ops),
        toggles={str(t.get("toggle")) for t in ctx.get("toggles") or [] if isinstance(t, dict)},
        traced=not trace.memory.empty,
        untracked_bytes=_untracked(recorded),
        notes=notes,
    )


def _split(categories: Sequence[float], scores: Sequence[float]) -> list[float]:
    """One row of ``PARTS`` from the five category bytes and the four score bytes
    (activations per sample, batch-free, other per sample, batch-free)."""
    p, g, o, a, x = categories
    a_s, a_f, x_s, x_f = scores
    a_s, a_f = min(a_s, a), min(a_f, max(0.0, a - a_s))
    x_s, x_f = min(x_s, x), min(x_f, max(0.0, x - x_s))
    return [p, g, o, a - a_s - a_f, a_s, a_f, x - x_s - x_f, x_s, x_f]


def _timeline(
    run: Run, trace: Trace, step: int, categories: dict[str, float], at_peak: ScoreBytes, scores: _Scores
) -> np.ndarray:
    """Rows of ``PARTS``: the peak (medians), then every point of ``step``'s memory
    timeline with the score tensors alive at that moment (its run-clock time taken back to
    the trace's clock: the step begins at the same instant on both)."""
    peak_scores = [at_peak.activations_per_sample, at_peak.activations_batch_free]
    peak_scores += [at_peak.other_per_sample, at_peak.other_batch_free]
    rows = [_split(list(categories.values()), peak_scores)]
    points = run.memory[run.memory["step"] == step] if len(run.memory) else run.memory
    starts = run.steps.loc[run.steps["step"] == step, "start_s"] if "start_s" in run.steps else pd.Series()
    spans = trace.steps.loc[trace.steps["step"] == step, "start_us"]
    if not len(points):
        return np.array(rows, dtype=float)
    if len(starts) and len(spans):
        ts_us = float(spans.iloc[0]) + (points["t_s"].to_numpy(dtype=float) - float(starts.iloc[0])) * 1e6
        alive = scores.alive(step, ts_us)
    else:
        alive = np.zeros((len(points), 4))
    values = points[_CATEGORY_COLUMNS].to_numpy(dtype=float)
    rows += [_split(v, a) for v, a in zip(values, alive, strict=True)]
    return np.array(rows, dtype=float)


def _untracked(recorded: pd.DataFrame) -> float:
    """Median bytes by which the steps' measured peak (CUDA: max_memory_allocated) exceeds the
    sum of their categories; 0 on CPU, where the peak is that sum."""
    if "peak_tensor_bytes" not in recorded:
        return 0.0
    gap = pd.to_numeric(recorded["peak_tensor_bytes"], errors="coerce") - recorded[_CATEGORY_COLUMNS].sum(
        axis=1
    )
    gap = gap.dropna()
    return max(0.0, float(gap.median())) if len(gap) else 0.0


def _parameters(ctx: Mapping[str, Any], parameter_bytes: float, notes: list[str]) -> tuple[str, int, int]:
    """(dtype, bytes per element, count) of the run's parameters, from its context and the
    measured parameter bytes."""
    raw = ctx.get("dtype")
    try:
        dtype = dtype_name(raw) if raw else "float32"
    except ConfigError:
        dtype = "float32"
        notes.append(f"the run's parameters are {raw}, not a dtype a forecast scales: taken as float32")
    if not raw:
        notes.append("the run's context does not say its parameters' dtype: taken as float32")
    element = DTYPE_BYTES[dtype]
    params = int(ctx.get("params") or round(parameter_bytes / element))
    return dtype, element, params


def _device_type(run: Run, trace: Trace) -> int:
    """The profiler's device type of the tensors that matter: CUDA's (1) when the run was on
    a GPU and the trace has its allocations, else the CPU's (0)."""
    if run.environment.get("device") == "cuda" and (trace.memory["device_type"] == 1).any():
        return 1
    return 0


def _first_backward(trace: Trace) -> pd.Series:
    backward = trace.events[trace.events["name"].str.startswith(tn.AUTOGRAD_PREFIX)]
    return backward.groupby("step")["ts_us"].min()


class _Scores:
    """The [.., T, T] tensors of an eager attention in each recorded step's allocations, by
    category and by whether they grow with the batch. An allocation is one when the
    advisor's rule says so (its size is that of a softmax's [.., T, T] input over some of its
    leading dims, and an op enclosing it works on [.., T, T] tensors); it is an activation
    when it was made before backward began and was still alive then, as the memory
    categories count it; batch-free when it is [T, T] alone (at batch 1 only a 1-byte one,
    a boolean mask, is told apart from a [1, 1, T, T] score)."""

    def __init__(self, trace: Trace, ops: pd.DataFrame, device_type: int, batch: int) -> None:
        self.shapes = _square_inputs(ops)
        self.seqs = {s[-1] for s in self.shapes}
        self.sizes = _square_sizes(self.shapes)
        self.batch_free = (
            {t * t for t in self.seqs} if batch == 1 else {t * t * e for t in self.seqs for e in (1, 2, 4, 8)}
        )
        self.trace, self.ops = trace, ops
        self.memory = trace.memory[trace.memory["device_type"] == device_type]
        self.first_backward = _first_backward(trace)
        self._cache: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}

    def _step(self, step: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(event times, score bytes alive after each event (n × 4), index of the step's peak)."""
        if step not in self._cache:
            m = self.memory[self.memory["step"] == step]
            ts_us = m["ts_us"].to_numpy(dtype=float)
            if not self.shapes or m.empty:
                self._cache[step] = (ts_us, np.zeros((len(m), 4)), 0)
            else:
                kinds = self._kinds(
                    m, self.ops[self.ops["step"] == step], float(self.first_backward.get(step, np.inf))
                )
                peak = int(np.argmax(np.cumsum(m["bytes"].to_numpy())))
                self._cache[step] = (ts_us, np.cumsum(kinds, axis=0), peak)
        return self._cache[step]

    def at_peak(self, step: int) -> list[float]:
        """Score bytes alive at the step's peak: [activations per sample, activations
        batch-free, other per sample, other batch-free]."""
        _, alive, peak = self._step(step)
        return alive[peak].tolist() if len(alive) else [0.0] * 4

    def alive(self, step: int, ts_us: np.ndarray) -> np.ndarray:
        """Score bytes alive at each of these times (µs on the trace clock), n × 4."""
        times, alive, _ = self._step(step)
        if not len(times):
            return np.zeros((len(ts_us), 4))
        i = np.searchsorted(times, ts_us + 0.5, side="right") - 1  # half a µs for the clock round trip
        return np.where((i >= 0)[:, None], alive[np.clip(i, 0, None)], 0.0)

    def _kinds(self, m: pd.DataFrame, ops: pd.DataFrame, backward_us: float) -> np.ndarray:
        """Per allocation event of one step: its bytes in the column of its kind (±)."""
        op_start, op_end = ops["ts_us"].to_numpy(), ops["end_us"].to_numpy()
        op_dims = ops["input_dims"].to_numpy()
        ts_us, nbytes, addrs = m["ts_us"].to_numpy(), m["bytes"].to_numpy(), m["addr"].to_numpy()
        freed_at: dict[int, float] = {}  # allocation index -> when it was freed
        open_allocs: dict[Any, int] = {}
        for i in range(len(m)):
            if nbytes[i] > 0:
                open_allocs[addrs[i]] = i
            elif addrs[i] in open_allocs:
                freed_at[open_allocs.pop(addrs[i])] = ts_us[i]
        kinds = np.zeros((len(m), 4))
        open_scores: dict[Any, int] = {}  # addr -> column of kinds
        for i in np.flatnonzero(np.isin(np.abs(nbytes), list(self.sizes))).tolist():
            ts, addr = ts_us[i], addrs[i]
            if nbytes[i] > 0:
                enclosing = np.flatnonzero((op_start <= ts) & (op_end >= ts))
                innermost_first = enclosing[np.argsort(-op_start[enclosing], kind="stable")]
                if not _makes_square(op_dims[innermost_first], self.shapes):
                    continue
                kept = ts < backward_us and freed_at.get(i, np.inf) >= backward_us
                open_scores[addr] = (0 if kept else 2) + (1 if nbytes[i] in self.batch_free else 0)
                col = open_scores[addr]
            elif addr in open_scores:
                col = open_scores.pop(addr)
            else:
                continue
            kinds[i, col] = nbytes[i]
        return kinds


def _score_like(d: list[int], scores: set[tuple[int, ...]]) -> bool:
    """Whether a shape is one of the score shapes ``[B, H, T, T]``, its ``[B·H, T, T]`` view,
    or a mask that broadcasts to it (``[T, T]``, ``[B, 1, T, T]``, ``[B, 1, 1, T]``): not any
    tensor whose last two sides happen to be T (an MLP's ``[B, T, 4·d]`` when 4·d = T)."""
    lead = math.prod(d[:-2])
    for s in scores:
        if d[-1] != s[-1] or d[-2] not in (1, s[-2]):
            continue
        if lead in (1, math.prod(s[:-2])):
            return True
        if len(d) == len(s) and all(a in (1, b) for a, b in zip(d[:-2], s[:-2], strict=True)):
            return True
    return False


def _makes_square(op_dims: np.ndarray, scores: set[tuple[int, ...]]) -> bool:
    """Whether the innermost of the ops enclosing an allocation that has tensor inputs
    (``op_dims``: innermost first) makes a [.., T, T] tensor: it works on score-shaped
    tensors alone (softmax, its backward, scaling, masking, dropout), or multiplies
    [.., T, k] by [.., k, T] into a score shape. Stricter than the advisor's
    ``_makes_scores``, which asks whether any enclosing op touches a [.., T, T] tensor:
    there, the copies of q and k a matmul makes, a [.., T, T] × [.., T, d] product or an
    MLP's [B, T, 4·d] count when their size happens to be that of a score tensor."""
    for text in op_dims:
        shapes = [
            d
            for d in input_dims(text)
            if isinstance(d, list) and len(d) >= 2 and all(isinstance(x, int) for x in d)
        ]
        if not shapes:
            continue
        if any(d[-1] == d[-2] for d in shapes) and all(_score_like(d, scores) for d in shapes):
            return True
        if len(shapes) != 2:
            return False
        a, b = shapes
        product = [*a[:-1], b[-1]]
        return a[-1] == b[-2] and product[-1] == product[-2] and _score_like(product, scores) and len(a) > 2
    return False


def _matrices(trace: Trace, ops: pd.DataFrame, step: int) -> dict[tuple[int, int], int]:
    """The weights of the linear layers one forward pass used: (out, in) → how many,
    from ``aten::linear``'s recorded input shapes (empty without shapes)."""
    start = float(_first_backward(trace).get(step, np.inf))
    linear = ops[(ops["name"] == "aten::linear") & (ops["step"] == step) & (ops["ts_us"] < start)]
    shapes: Counter = Counter()
    for text in linear["input_dims"]:
        dims = input_dims(text)
        if len(dims) > 1 and isinstance(dims[1], list) and len(dims[1]) == 2:
            shapes[(int(dims[1][0]), int(dims[1][1]))] += 1
    return dict(shapes)


def _blocks(ops: pd.DataFrame, trace: Trace, ctx: Mapping[str, Any]) -> tuple[int, str]:
    """How many blocks repeat, and what says so: attention calls per step in the trace (one
    per transformer block, as the advisor counts them), else the run's context; 0 unknown."""
    n_steps = max(1, len(trace.steps))
    _, _, eager = _eager_attention(ops, n_steps)
    calls = max(eager, round(int(ops["name"].eq(SDPA).sum()) / n_steps))
    if calls > 1:
        return calls, "attention layers per step in the trace"
    for key in ("n_layer", "num_hidden_layers"):
        if ctx.get(key):
            return int(ctx[key]), f"run context {key}"
    return 0, ""


def _hidden(ops: pd.DataFrame) -> int | None:
    """The model's width: the embedding table's second side, else the first linear's input."""
    for name, pick in (("aten::embedding", lambda d: d[0][1]), ("aten::linear", lambda d: d[0][-1])):
        for text in ops.loc[ops["name"] == name, "input_dims"].head(1):
            try:
                return int(pick(input_dims(text)))
            except (IndexError, TypeError, ValueError):
                continue
    return None


# -- how activations and other tensors grow ---------------------------------------------


@dataclass
class Growth:
    """Bytes of one category (activations or other) at the step's peak for B samples of T
    tokens: ``constant + per_token·B·T + per_score·B·T² + per_mask·T²``; ``how`` says how
    the coefficients were found."""

    constant: float
    per_token: float
    per_score: float
    per_mask: float
    how: str

    def parts(self, batch: float, seq: float) -> tuple[float, float, float, float]:
        return (
            self.constant,
            self.per_token * batch * seq,
            self.per_score * batch * seq**2,
            self.per_mask * seq**2,
        )


def _shape(m: Measured) -> tuple[int, int]:
    """(B, T) of a run; T = 1 for a model without a token sequence."""
    return m.batch_size or 1, m.seq_len or 1


def growth(m: Measured, calibration: Measured | None = None) -> dict[str, Growth]:
    """How ``m``'s activations and other tensors grow with batch and sequence: from its
    [.., T, T] tensors and the rest linear in tokens, or fitted to a second run."""
    out = {}
    b, t = _shape(m)
    for cat in ("activations", "other"):
        value = m.categories[cat]
        per_sample, batch_free = m.scores.of(cat)
        rest = max(0.0, value - per_sample - batch_free)
        single = Growth(0.0, rest / (b * t), per_sample / (b * t * t), batch_free / (t * t), "one run")
        out[cat] = single if calibration is None else _fit(single, m, calibration, cat)
    return out


def _fit(single: Growth, m: Measured, cal: Measured, cat: str) -> Growth:
    """Coefficients from two runs: with [.., T, T] tensors in the trace, the rest is fitted as
    constant + per token (two points, two unknowns); without, the whole category as per token
    + per B·T² when the sequence differs, or constant + per token when only the batch does."""
    (b1, t1), (b2, t2) = _shape(m), _shape(cal)
    v1, v2 = m.categories[cat], cal.categories[cat]
    s1, f1 = m.scores.of(cat)
    s2, f2 = cal.scores.of(cat)
    if s1 + f1 + s2 + f2 > 0 or t1 == t2:
        r1, r2 = v1 - s1 - f1, v2 - s2 - f2
        x1, x2 = b1 * t1, b2 * t2
        if x1 == x2:
            return replace(single, how="one run (the calibration run has as many tokens)")
        per_token = max(0.0, (r2 - r1) / (x2 - x1))
        return replace(single, constant=r1 - per_token * x1, per_token=per_token, how="fitted to two runs")
    # no score tensors seen: B·T and B·T² from the two totals
    a = np.array([[b1 * t1, b1 * t1 * t1], [b2 * t2, b2 * t2 * t2]], dtype=float)
    per_token, per_score = np.linalg.solve(a, np.array([v1, v2]))
    if per_token < 0 or per_score < 0:  # noise on a purely linear or purely quadratic part
        per_token, per_score = (max(0.0, per_token), 0.0) if per_score < 0 else (0.0, v1 / (b1 * t1 * t1))
    return Growth(0.0, float(per_token), float(per_score), 0.0, "fitted to two runs (no score tensors seen)")


# -- a configuration and its peak --------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """What a forecast is for: B samples of T tokens per rank, parameter dtype, optimizer,
    toggles ({id: params}) and ranks."""

    batch_size: int
    seq_len: int
    dtype: str
    optimizer: str | None
    toggles: Mapping[str, Mapping[str, int]]
    world_size: int

    @property
    def shards(self) -> tuple[int, int, int]:
        """How many ways parameters, gradients and optimizer state are split."""
        n = self.world_size
        stage = 3 if "fsdp" in self.toggles else self.toggles.get("zero", {}).get("stage", 0)
        return (n if stage >= 3 else 1, n if stage >= 2 else 1, n if stage >= 1 else 1)


@dataclass
class Peak:
    """Bytes by category at the forecast step's peak, and one line of derivation each."""

    categories: dict[str, float]
    lines: list[str]

    @property
    def total(self) -> float:
        return float(sum(self.categories.values()))


def _n(x: float) -> str:
    return f"{x:,.0f}"


class _Model:
    """The measured run and its growth, ready to price configurations."""

    def __init__(self, m: Measured, grow: dict[str, Growth]) -> None:
        self.m, self.grow = m, grow

    # weights ------------------------------------------------------------------------

    def parameters(self, cfg: Config) -> tuple[float, str]:
        m = self.m
        e = DTYPE_BYTES[cfg.dtype]
        shard = cfg.shards[0]
        value = m.categories["parameters"] * e / m.element_bytes / shard
        line = f"parameters: {_n(m.params)} × {e} B ({cfg.dtype})"
        if e != m.element_bytes:
            line += f", measured {fmt_bytes(m.categories['parameters'])} at {m.element_bytes} B each"
        return value, line + _shard_text(shard, "parameters") + f" = {fmt_bytes(value)}"

    def gradients(self, cfg: Config) -> tuple[float, float, str]:
        """(at the measured peak's share, all of them, line) in bytes."""
        m = self.m
        e = DTYPE_BYTES[cfg.dtype]
        shard = cfg.shards[1]
        full = m.categories["parameters"] * e / m.element_bytes / shard
        share = (
            min(1.0, m.categories["gradients"] / m.categories["parameters"])
            if m.categories["parameters"]
            else 0
        )
        if share >= 0.999:
            line = f"gradients: all {_n(m.params)} × {e} B"
        else:
            line = (
                f"gradients: {share:.0%} of the {_n(m.params)} were alive at the measured peak (backward frees "
                f"activations as it makes gradients) × {e} B"
            )
        return share * full, full, line + _shard_text(shard, "gradients") + f" = {fmt_bytes(share * full)}"

    def optimizer_state(self, cfg: Config) -> tuple[float, str]:
        m = self.m
        name = cfg.optimizer or m.optimizer
        shard = cfg.shards[2]
        e = DTYPE_BYTES[cfg.dtype]
        measured = m.categories["optimizer_state"]
        run_states = self._run_states()
        extra = max(0.0, measured - run_states * m.params * self._state_bytes(m.optimizer, m.element_bytes))
        if "galore" in cfg.toggles:
            elems, text = self._galore(cfg.toggles["galore"]["rank"])
        elif name == m.optimizer or name is None:
            ratio = self._state_bytes(name, e) / self._state_bytes(name, m.element_bytes)
            value = measured * ratio / shard
            text = f"optimizer state: {name or 'the run’s optimizer'} as measured, {fmt_bytes(measured)}"
            if name in OPTIMIZERS and m.params:
                per = self._state_bytes(name, m.element_bytes)
                text += (
                    f" ({run_states:g} × {_n(m.params)} × {per} B"
                    + (f" + {_n(extra)} B" if extra else "")
                    + ")"
                )
            if ratio != 1:
                text += f" × {ratio:g} for {cfg.dtype} state"
            return value, text + _shard_text(shard, "optimizer state") + f" = {fmt_bytes(value)}"
        else:
            elems, text = self._elements(name)
        per = self._state_bytes(name, e)
        value = (elems * per + extra) / shard
        text += f" × {per} B"
        if extra:
            text += f" + {fmt_bytes(extra)} of step counters and the like as measured"
        return value, text + _shard_text(shard, "optimizer state") + f" = {fmt_bytes(value)}"

    def _run_states(self) -> float:
        """States per parameter of the run's optimizer: SGD's measured (momentum or not),
        others' from the table."""
        m = self.m
        state = OPTIMIZERS.get(m.optimizer or "")
        if state is None or (m.optimizer == "SGD" and m.params):
            per = self._state_bytes(m.optimizer, m.element_bytes)
            return float(round(m.categories["optimizer_state"] / (m.params * per))) if m.params else 0.0
        return float(state.states)

    def _state_bytes(self, name: str | None, element_bytes: int) -> int:
        state = OPTIMIZERS.get(name or "")
        return state.element_bytes if state and state.element_bytes else element_bytes

    def _elements(self, name: str) -> tuple[float, str]:
        state = OPTIMIZERS.get(name)
        if state is None:
            raise ConfigError("optimizer", f"must be one of {', '.join(OPTIMIZERS)}", name)
        m = self.m
        if state.factored:
            shapes, how = self._shapes()
            in_matrices = sum(a * b * k for (a, b), k in shapes.items())
            elems = sum((a + b) * k for (a, b), k in shapes.items()) + max(0, m.params - in_matrices)
            return elems, (
                f"optimizer state: Adafactor's row and column second moments of the weight matrices {how} "
                f"(m + n each) and one per other parameter: {_n(elems)} elements"
            )
        states = self._run_states() if name == m.optimizer else state.states
        return (
            states * m.params,
            f"optimizer state: {name} keeps {states:g} per parameter: {states:g} × {_n(m.params)}",
        )

    def _shapes(self) -> tuple[dict[tuple[int, int], int], str]:
        """The weight matrices, and where they come from: the trace's linear layers, else
        square d×d matrices holding every parameter (d the width when known, else √P)."""
        m = self.m
        shapes = m.matrices
        if shapes and sum(a * b * k for (a, b), k in shapes.items()) <= m.params * 1.001:
            return shapes, f"({sum(shapes.values())} linear layers' weights, shapes from the trace)"
        d = m.hidden or max(1, math.isqrt(m.params))
        k = max(1, m.params // (d * d))
        source = "the model width from the trace" if m.hidden else "√(parameter count)"
        return {
            (d, d): k
        }, f"(assumed: {k} square {d}×{d} matrices, {source}; the trace has no linear shapes)"

    def _galore(self, rank: int) -> tuple[float, str]:
        """GaLore AdamW's moments: for an m×n weight with both sides above the rank (m ≤ n),
        2·r·n + m·r (two r×n moments and the m×r projection) instead of 2·m·n; every other
        parameter keeps Adam's two."""
        m = self.m
        if (m.optimizer or "Adam") not in ADAM_LIKE:
            raise ConfigError(
                "toggles", f"galore replaces Adam/AdamW; this run's optimizer is {m.optimizer}", "galore"
            )
        shapes, how = self._shapes()
        projected = {s: k for s, k in shapes.items() if min(s) > rank}
        in_projected = sum(a * b * k for (a, b), k in projected.items())
        low_rank = sum((2 * rank * max(a, b) + min(a, b) * rank) * k for (a, b), k in projected.items())
        full = 2 * (m.params - in_projected)
        return low_rank + full, (
            f"optimizer state: GaLore rank {rank} on {sum(projected.values())} weight matrices {how}: "
            f"Σ (2·r·n + m·r) = {_n(low_rank)} elements instead of 2·m·n = {_n(2 * in_projected)}, "
            f"+ 2 × {_n(m.params - in_projected)} other parameters = {_n(low_rank + full)} elements"
        )

    # activations and other -----------------------------------------------------------

    def variable(self, cat: str, cfg: Config) -> tuple[np.ndarray, float, str]:
        """How ``cat`` (activations or other) scales for ``cfg``: factors for its three parts
        (the rest, [.., T, T] tensors per sample, batch-free ones), its bytes at the measured
        peak's point, and the derivation."""
        g, m = self.grow[cat], self.m
        b0, t0 = _shape(m)
        b, t = cfg.batch_size, (cfg.seq_len if m.seq_len else 1)
        flash = "flash_attention" in cfg.toggles
        per_sample, batch_free = m.scores.of(cat)
        rest = max(0.0, m.categories[cat] - per_sample - batch_free)
        constant, tokens, scores, masks = g.parts(b, t)
        terms = []
        if g.constant:
            terms.append(f"{fmt_bytes(g.constant)} constant")
        tokens_text = f" × ({t:,}/{t0:,}) tokens" if m.seq_len else ""
        samples = f"{b:,} sample" + ("s" if b != 1 else "")
        terms.append(f"{fmt_bytes(g.per_token * t0)}/sample × {samples}{tokens_text}")
        if per_sample + batch_free:
            new_rest = constant + tokens
            factors = [0.0, 0.0] if flash else [(b / b0) * (t / t0) ** 2, (t / t0) ** 2]
            if flash:
                terms.append(f"no [.., T, T] tensors ({fmt_bytes(per_sample + batch_free)} measured)")
            else:
                terms.append(
                    f"{fmt_bytes(per_sample / b0)}/sample of [B, H, T, T] tensors × {samples} × ({t:,}/{t0:,})²"
                )
                if batch_free:
                    terms.append(f"{fmt_bytes(batch_free)} of [T, T] masks × ({t:,}/{t0:,})²")
        else:  # no score tensors seen: a fitted B·T² part is theirs
            new_rest = constant + tokens + (0.0 if flash else scores + masks)
            factors = [0.0, 0.0]
            if g.per_score and not flash:
                terms.append(f"{fmt_bytes(g.per_score * t0 * t0)}/sample × {samples} × ({t:,}/{t0:,})²")
            elif g.per_score:
                terms.append("no part quadratic in T (fused attention)")
        scale = np.array([new_rest / rest if rest else 0.0, *factors])
        mult, more = self._multiplier(cfg)
        value = float(np.dot([rest, per_sample, batch_free], scale)) * mult
        shape = f"batch {b0}" + (f" × {t0:,} tokens" if m.seq_len else "")
        line = f"{cat}: {fmt_bytes(m.categories[cat])} measured at {shape} ({g.how}) → " + " + ".join(terms)
        return scale * mult, value, line + more + f" = {fmt_bytes(value)}"

    def _multiplier(self, cfg: Config) -> tuple[float, str]:
        """What dtype, autocast and sequence parallelism multiply activations and other by."""
        m = self.m
        text, mult = "", 1.0
        ratio = DTYPE_BYTES[cfg.dtype] / m.element_bytes
        if ratio != 1:
            mult *= ratio
            text += f"; × {ratio:g} for {cfg.dtype} tensors"
        if "bf16_autocast" in cfg.toggles and "bf16_autocast" not in m.toggles and cfg.dtype == "float32":
            mult *= 0.5
            text += (
                "; × ½ under bf16 autocast (it keeps softmax and norms in fp32 on some devices: expect more)"
            )
        if "sequence_parallel" in cfg.toggles:
            sp = cfg.toggles["sequence_parallel"]["sp_size"]
            mult /= sp
            text += f"; ÷ {sp} ranks of sequence parallelism"
        return mult, text

    # the step ------------------------------------------------------------------------

    def peak(self, cfg: Config) -> Peak:
        """The forecast step's peak: every point of the measured timeline scaled, the
        largest sum taken (the peak's own row first)."""
        m = self.m
        params, p_line = self.parameters(cfg)
        _, grads_full, g_line = self.gradients(cfg)
        state, o_line = self.optimizer_state(cfg)
        act_scale, act, a_line = self.variable("activations", cfg)
        other_scale, _, x_line = self.variable("other", cfg)
        ckpt, recomputed, a_line = self._checkpointing(act, a_line, cfg)
        other_extra, extra_lines = self._extras(cfg, params, grads_full)
        other_extra += recomputed
        measured_params = m.categories["parameters"] or 1.0
        weights = [params / measured_params, grads_full / measured_params]
        weights.append(state / m.categories["optimizer_state"] if m.categories["optimizer_state"] else 0.0)
        parts = m.timeline * np.concatenate([weights, act_scale * ckpt, other_scale])
        cats = np.column_stack(
            [parts[:, 0], parts[:, 1], parts[:, 2], parts[:, 3:6].sum(1), parts[:, 6:9].sum(1)]
        )
        cats[:, 2] += 0.0 if m.categories["optimizer_state"] else state  # state the run did not have
        cats[:, 4] += other_extra
        at = int(np.argmax(cats.sum(axis=1)))
        lines = [p_line, g_line, o_line, a_line, x_line, *extra_lines]
        if at:
            lines.append(
                "peak: the forecast step peaks elsewhere than the measured one, at the point of the measured "
                "step where the scaled categories add up to most ("
                + ", ".join(
                    f"{c.replace('_', ' ')} {fmt_bytes(v)}"
                    for c, v in zip(MEMORY_CATEGORIES, cats[at], strict=True)
                )
                + ")"
            )
        return Peak(dict(zip(MEMORY_CATEGORIES, cats[at].tolist(), strict=True)), lines)

    def _checkpointing(self, act: float, line: str, cfg: Config) -> tuple[float, float, str]:
        """Under gradient checkpointing: the factor activations are multiplied by, the bytes
        of the block backward recomputes (made after backward began, so counted as other),
        and the line."""
        m = self.m
        if "grad_checkpointing" not in cfg.toggles or "grad_checkpointing" in m.toggles or not act:
            return 1.0, 0.0, line
        every = cfg.toggles["grad_checkpointing"]["every_n"]
        blocks = m.blocks
        checkpointed = math.ceil(blocks / every)
        recomputed = act / blocks
        kept = checkpointed_peak(act, act, blocks, checkpointed) - recomputed
        text = (
            f"; {checkpointed} of {blocks} blocks ({m.blocks_from}) checkpointed keep A − A·{checkpointed}/{blocks}"
            f" = {fmt_bytes(kept)}"
        )
        if m.hidden:
            e = 2 if "bf16_autocast" in cfg.toggles else DTYPE_BYTES[cfg.dtype]
            t = cfg.seq_len if m.seq_len else 1
            sp = cfg.toggles.get("sequence_parallel", {}).get("sp_size", 1)
            boundary = checkpointed * cfg.batch_size * t * m.hidden * e / sp
            kept += boundary
            text += f" + their inputs ({checkpointed} × B·T·{m.hidden} × {e} B = {fmt_bytes(boundary)})"
        text += (
            f"; backward recomputes one block at a time, its A/{blocks} = {fmt_bytes(recomputed)} alive again "
            "(counted as other: made after backward began)"
        )
        return kept / act, recomputed, line + text + f" → {fmt_bytes(kept)}"

    def _extras(self, cfg: Config, params: float, grads_full: float) -> tuple[float, list[str]]:
        """Tensors the configuration adds that the run did not have (counted as other)."""
        m = self.m
        lines, extra = [], 0.0
        if m.untracked_bytes:
            extra += m.untracked_bytes
            lines.append(
                f"untracked: the measured peak held {fmt_bytes(m.untracked_bytes)} more than its categories (tensors "
                "made before the recording began: buffers, caches, the batch), kept as measured"
            )
        if "bf16_autocast" in cfg.toggles and "bf16_autocast" not in m.toggles and cfg.dtype == "float32":
            copies = params * cfg.shards[0] / 2
            extra += copies
            lines.append(
                f"bf16 autocast: bf16 copies of the weights that matmuls keep for backward, P × 2 B = {fmt_bytes(copies)}"
            )
        p_shard, g_shard, _ = cfg.shards
        if cfg.world_size > 1 and g_shard == 1 and m.world_size == 1:
            extra += grads_full
            lines.append(
                f"DDP over {cfg.world_size} ranks: its gradient buckets hold one more copy of the gradients, "
                f"{fmt_bytes(grads_full)} (none with gradient_as_bucket_view=True)"
            )
        if p_shard > 1:
            blocks = max(1, m.blocks)
            gathered = 2 * params * p_shard / blocks
            extra += gathered
            lines.append(
                f"sharded parameters: two blocks' worth gathered at a time (the current and the prefetched), "
                f"2 × P/{blocks} = {fmt_bytes(gathered)}"
            )
        return extra, lines


def _shard_text(shard: int, what: str) -> str:
    return f" ÷ {shard} ranks ({what} sharded)" if shard > 1 else ""


# -- the forecast ------------------------------------------------------------------------


@dataclass
class Forecast:
    """Peak tensor memory of a training step in another configuration, and whether it fits.

    categories: bytes at the forecast peak (parameters, gradients, optimizer_state,
    activations, other); total_bytes: their sum; device: the preset (or capacity) it is for,
    capacity_bytes: its total memory, context_bytes: what the CUDA context takes of it,
    usable_bytes: the rest; fits: total ≤ usable; headroom_bytes: usable − total (negative:
    short by that much); max_batch_size: the largest batch that fits at ``seq_len`` (0: not
    even one sample; None: unknown, or more than 2**24), max_seq_len: the longest sequence
    at ``batch_size`` (None: the run has no sequence, or unbounded); derivation: one line per
    category (the formula with its numbers) and per assumption; expected_error_pct: how far
    off the total may be (±%), expected_error: why; measured: the run's categories at its
    peak, measured_config: its batch, sequence, dtype, optimizer and ranks.
    """

    run_id: str
    device: str
    capacity_bytes: float
    context_bytes: float
    batch_size: int
    seq_len: int | None
    dtype: str
    optimizer: str | None
    toggles: tuple[str, ...]
    world_size: int
    categories: dict[str, float]
    total_bytes: float
    usable_bytes: float
    fits: bool
    headroom_bytes: float
    max_batch_size: int | None
    max_seq_len: int | None
    derivation: list[str]
    expected_error_pct: float
    expected_error: str
    measured: dict[str, float]
    measured_config: dict[str, Any]
    device_source: str = ""

    def table(self) -> pd.DataFrame:
        """One row per category and the total: ``measured_bytes`` (the run, at its peak),
        ``forecast_bytes``, ``share_pct`` (of the device's usable memory)."""
        rows = [
            (c, self.measured.get(c, 0.0), self.categories[c], 100.0 * self.categories[c] / self.usable_bytes)
            for c in MEMORY_CATEGORIES
        ]
        rows.append(
            (
                "total",
                sum(self.measured.values()),
                self.total_bytes,
                100.0 * self.total_bytes / self.usable_bytes,
            )
        )
        return pd.DataFrame(rows, columns=["category", "measured_bytes", "forecast_bytes", "share_pct"])

    def config_text(self) -> str:
        """``batch 32 × 4096 tokens, bfloat16, AdamW, flash_attention, 1 rank``."""
        shape = f"batch {self.batch_size}" + (f" × {self.seq_len:,} tokens" if self.seq_len else "")
        parts = [shape, self.dtype, self.optimizer or "the run's optimizer"]
        parts += list(self.toggles) or ["no toggles"]
        parts.append(f"{self.world_size} rank" + ("s" if self.world_size != 1 else ""))
        return ", ".join(parts)

    def sentences(self) -> list[str]:
        """The verdict, the room and the limits in whole sentences."""
        verdict = (
            f"It fits, with {fmt_bytes(self.headroom_bytes)} to spare."
            if self.fits
            else f"It does not fit: {fmt_bytes(-self.headroom_bytes)} too much."
        )
        out = [
            f"On {self.device} ({self.config_text()}), a training step would peak at about "
            f"{fmt_bytes(self.total_bytes)} of tensors (± {self.expected_error_pct:.0f} %). {verdict}",
            f"The device holds {fmt_bytes(self.capacity_bytes)}, of which the CUDA context takes about "
            f"{fmt_bytes(self.context_bytes)}, leaving {fmt_bytes(self.usable_bytes)} for tensors.",
        ]
        limits = []
        if self.seq_len:
            limits.append(
                f"the largest batch that fits at {self.seq_len:,} tokens is {_limit(self.max_batch_size)}"
            )
            limits.append(
                f"the longest sequence at batch {self.batch_size} is {_limit(self.max_seq_len, ' tokens')}"
            )
        else:
            limits.append(f"the largest batch that fits is {_limit(self.max_batch_size)}")
        out.append(limits[0][0].upper() + "; ".join(limits)[1:] + ".")
        out.append(f"Expected error: {self.expected_error}")
        return out

    def __str__(self) -> str:
        lines = [*self.sentences(), "", "By category (forecast, measured in the run):"]
        width = max(len(c) for c in MEMORY_CATEGORIES)
        for c in MEMORY_CATEGORIES:
            lines.append(
                f"  {c.replace('_', ' '):<{width}}  {fmt_bytes(self.categories[c]):>10}  ({fmt_bytes(self.measured.get(c))})"
            )
        lines.append(
            f"  {'total':<{width}}  {fmt_bytes(self.total_bytes):>10}  ({fmt_bytes(sum(self.measured.values()))})"
        )
        lines += ["", "How:", *(f"  {d}" for d in self.derivation)]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{escape(r.category.replace('_', ' '))}</td><td style='text-align:right'>"
            f"{escape(fmt_bytes(r.forecast_bytes))}</td><td style='text-align:right'>{escape(fmt_bytes(r.measured_bytes))}"
            f"</td></tr>"
            for r in self.table().itertuples()
        )
        paras = "".join(f"<p>{escape(s)}</p>" for s in self.sentences())
        how = "".join(f"<li>{escape(d)}</li>" for d in self.derivation)
        return (
            f"<div class='swift-nb-forecast'>{paras}<table><tr><th>category</th><th>forecast</th>"
            f"<th>measured</th></tr>{rows}</table><details><summary>How each number is found</summary>"
            f"<ul>{how}</ul></details></div>"
        )


def _limit(value: int | None, unit: str = "") -> str:
    if value is None:
        return f"not limited by memory up to {SEARCH_LIMIT:,}{unit}"
    return f"{value:,}{unit}" if value else f"none: not even 1{unit or ' sample'} fits"


def forecast(
    run: Run | Measured,
    device: str | float = "A100-80GB",
    batch_size: int | None = None,
    seq_len: int | None = None,
    dtype: str | None = None,
    toggles: str | Sequence[str] | Mapping[str, Mapping[str, Any]] = (),
    world_size: int | None = None,
    calibration: Run | Measured | None = None,
    optimizer: str | None = None,
) -> Forecast:
    """The peak tensor memory of a training step of ``run``'s model at ``batch_size``
    samples (per rank) of ``seq_len`` tokens, parameters in ``dtype``, with ``optimizer``
    (a class name; default the run's), ``toggles`` (``"grad_checkpointing"``,
    ``"flash_attention"``, ``"galore:rank=128"``, ``"sequence_parallel:sp_size=4"``,
    ``"bf16_autocast"``, ``"zero:stage=2"``, ``"fsdp"``) over ``world_size`` ranks, on
    ``device`` (a preset of ``DEVICES``, a number of bytes, ``"80GB"`` or ``"24GiB"``).
    Unset arguments are the run's own. ``calibration``: a run of the same model at another
    batch size or sequence length, to fit how activations grow instead of reading it from
    the trace. Raises ``ConfigError`` for a bad argument or a run without memory categories."""
    dev = resolve_device(device)
    wanted = parse_toggles(toggles)
    _check_positive(batch_size=batch_size, seq_len=seq_len, world_size=world_size)
    dtype = dtype_name(dtype) if dtype is not None else None
    if optimizer is not None and optimizer not in OPTIMIZERS:
        raise ConfigError("optimizer", f"must be one of {', '.join(OPTIMIZERS)}", optimizer)
    m = run if isinstance(run, Measured) else measure(run)
    cal = calibration if isinstance(calibration, Measured) or calibration is None else measure(calibration)
    _check_against_run(m, cal, batch_size, seq_len)
    world = world_size or m.world_size
    if ("zero" in wanted or "fsdp" in wanted) and world < 2:
        raise ConfigError("world_size", "must be at least 2 to shard with zero or fsdp", world)
    if "grad_checkpointing" in wanted and m.blocks < 1:
        raise ConfigError(
            "toggles",
            "grad_checkpointing needs the number of repeated blocks, and the trace shows no attention layers: "
            "profile with context={'n_layer': L}",
            "grad_checkpointing",
        )
    cfg = Config(
        batch_size=batch_size or m.batch_size or 1,
        seq_len=seq_len or m.seq_len or 1,
        dtype=dtype or m.dtype,
        optimizer=optimizer or m.optimizer,
        toggles=wanted,
        world_size=world,
    )
    model = _Model(m, growth(m, cal))
    peak = model.peak(cfg)
    usable = float(dev.capacity_bytes - dev.context_bytes)

    def fits(c: Config) -> bool:
        return model.peak(c).total <= usable

    max_batch = _largest(lambda b: fits(replace(cfg, batch_size=b)), cfg.batch_size) if m.batch_size else None
    max_seq = _largest(lambda t: fits(replace(cfg, seq_len=t)), cfg.seq_len) if m.seq_len else None
    error_pct, error_text = _expected_error(m, cal, cfg)
    notes = [*m.notes]
    already = sorted(set(wanted) & m.toggles)
    if already:
        notes.append(f"the run already had {', '.join(already)}: its measurement includes the effect")
    return Forecast(
        run_id=m.run_id,
        device=dev.name,
        capacity_bytes=float(dev.capacity_bytes),
        context_bytes=float(dev.context_bytes),
        batch_size=cfg.batch_size,
        seq_len=cfg.seq_len if m.seq_len else None,
        dtype=cfg.dtype,
        optimizer=cfg.optimizer,
        toggles=tuple(_toggle_label(k, v) for k, v in wanted.items()),
        world_size=cfg.world_size,
        categories=peak.categories,
        total_bytes=peak.total,
        usable_bytes=usable,
        fits=peak.total <= usable,
        headroom_bytes=usable - peak.total,
        max_batch_size=max_batch,
        max_seq_len=max_seq,
        derivation=[
            *peak.lines,
            f"device: {dev.name}, {fmt_bytes(dev.capacity_bytes)} ({dev.source}) − CUDA context "
            f"{fmt_bytes(dev.context_bytes)} = {fmt_bytes(usable)} for tensors",
            *notes,
        ],
        expected_error_pct=error_pct,
        expected_error=error_text,
        measured=dict(m.categories),
        measured_config={
            "batch_size": m.batch_size,
            "seq_len": m.seq_len,
            "dtype": m.dtype,
            "optimizer": m.optimizer,
            "world_size": m.world_size,
        },
        device_source=dev.source,
    )


def _toggle_label(name: str, params: Mapping[str, int]) -> str:
    defaults = TOGGLES[name]
    given = {
        k: v
        for k, v in params.items()
        if defaults.get(k) != v or name in ("galore", "sequence_parallel", "zero")
    }
    return name + (":" + ",".join(f"{k}={v}" for k, v in given.items()) if given else "")


def _check_positive(**values: int | None) -> None:
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ConfigError(name, "must be a whole number of at least 1", value)


def _check_against_run(
    m: Measured, cal: Measured | None, batch_size: int | None, seq_len: int | None
) -> None:
    if batch_size is not None and batch_size != m.batch_size and m.batch_size is None:
        raise ConfigError(
            "batch_size",
            "cannot be forecast: the run's batch size is unknown (no token or linear input in the trace); "
            "profile with context={'batch_size': B}",
            batch_size,
        )
    if seq_len is not None and seq_len != m.seq_len and m.seq_len is None:
        raise ConfigError(
            "seq_len",
            "cannot be forecast: the run's sequence length is unknown (no [batch, seq] token input in the "
            "trace); profile with context={'seq_len': T}",
            seq_len,
        )
    if cal is None:
        return
    if _shape(cal) == _shape(m):
        raise ConfigError(
            "calibration", "must be a run at another batch size or sequence length than the run", cal.run_id
        )
    if m.params and abs(cal.params - m.params) > 0.1 * m.params:
        raise ConfigError(
            "calibration",
            f"must be a run of the same model ({m.params:,} parameters; it has {cal.params:,})",
            cal.run_id,
        )


def _largest(fits: Callable[[int], bool], start: int) -> int | None:
    """The largest n ≥ 1 with fits(n) (fits grows false with n): 0 when not even 1 fits, None
    when n = SEARCH_LIMIT still does."""
    if not fits(1):
        return 0
    lo, hi = 1, max(2, start)
    while fits(hi):
        if hi >= SEARCH_LIMIT:
            return None
        lo, hi = hi, min(SEARCH_LIMIT, hi * 2)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _expected_error(m: Measured, cal: Measured | None, cfg: Config) -> tuple[float, str]:
    """± % on the total, and why."""
    text = (
        f"± {ERROR_BASE_PCT:.0f} % for the sizes: forecasts of another batch, sequence, dtype or optimizer came "
        "within 0.5 % of the measured peak in benchmarks/forecast.py (four models on CPU), and a GPU adds its "
        "allocator's rounding and library workspaces; parameters, gradients and optimizer state are exact, "
        "activations extrapolated."
    )
    added = {t: ERROR_ADDED_PCT[t] for t in cfg.toggles if t in ERROR_ADDED_PCT and t not in m.toggles}
    b0, t0 = _shape(m)
    stretch = (cfg.batch_size * (cfg.seq_len if m.seq_len else 1)) / (b0 * t0)
    if not m.traced and cal is None and (cfg.seq_len != t0 or "flash_attention" in cfg.toggles) and m.seq_len:
        added["no allocations in the trace"] = ERROR_NO_TRACE_PCT
    if stretch > 16:
        added[f"{stretch:.0f}× the run's tokens per step"] = ERROR_FAR_PCT
    if added:
        text += " Added for " + ", ".join(f"{k} (± {v:.0f} %)" for k, v in added.items()) + "."
    if stretch > 16:
        text += " Profile nearer the target to narrow it."
    text += (
        " On CUDA the caching allocator also reserves more than tensors hold (fragmentation, often 5–15 %): "
        "leave that much headroom."
    )
    total = ERROR_BASE_PCT + sum(added.values())
    return total, f"± {total:.0f} % on the total. " + text
