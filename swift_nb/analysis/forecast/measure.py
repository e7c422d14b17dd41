"""What a run measured that a forecast scales: its memory by category at the step's peak,
the [.., T, T] tensors among it, its memory timeline split the same way, its shape (batch,
sequence), its parameters (dtype, count, the weight matrices' shapes), its frozen weights
and fine-tuning (``context["finetune"]``) and its repeated blocks, read from the run's
tables and its trace.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from swift_nb.analysis.scores import SDPA, ScoreTimeline, eager_attention, first_backward_us
from swift_nb.analysis.throughput import batch_and_seq
from swift_nb.analysis.trace.shapes import input_dims
from swift_nb.analysis.trace.tables import Trace, cat_in, load_trace, parse_events
from swift_nb.core.errors import ConfigError, RecordError
from swift_nb.record import FINETUNE_KEY, MEMORY_CATEGORIES, Run, repeated_blocks
from swift_nb.record.write import peak_step
from swift_nb.vocabulary.forecast_spec import DTYPE_BYTES, dtype_name


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
#: other each split into the rest, [.., T, T] tensors per sample and batch-free ones, then
#: the loss's logits (B·T × V, linear in tokens).
PARTS = [
    "parameters",
    "frozen_parameters",
    "gradients",
    "optimizer_state",
    "activations_rest",
    "activations_per_sample",
    "activations_batch_free",
    "other_rest",
    "other_per_sample",
    "other_batch_free",
    "logits",
]


@dataclass
class Measured:
    """What one run measured, as a forecast reads it.

    categories: bytes at the run's peak (``record.write.peak_step``: the recorded step whose
    peak is the median, at its peak moment); scores: its [.., T, T] tensors at that peak;
    timeline: bytes of each of ``PARTS`` over that step, one row per point of its memory
    timeline, the peak's row first; batch_size, seq_len: that step's shape where the
    context does not give them (None: unknown); dtype / element_bytes of its parameters;
    params: their count; matrices: the m×n weights of its linear layers (from the trace)
    with how many of each; blocks: its repeated blocks (attention layers in the trace, or
    the context), hidden: the model width, vocab: its embedding's rows (None: unknown);
    finetune: the run's ``context["finetune"]`` (empty: not recorded); frozen_measured:
    whether the run measured its frozen weights (a run recorded before
    ``frozen_parameters`` existed did not: they count 0); frozen_params: their elements (parameters no optimizer trains; buffers are in
    the bytes, not the count), frozen_dtype: their dtype (``uint8`` when packed), and
    compute_dtype: the dtype its activations are in (a LoRA run's base's, else its
    parameters'); traced: whether the trace holds its allocations (without them,
    [.., T, T] tensors cannot be told apart); untracked_bytes: how much more the step's
    peak held than its categories (CUDA's allocator counts tensors the profiler never saw
    allocated: buffers, caches, the batch made before recording began); notes: what could not be read and what was
    assumed; step_s: its median step (s; None: unknown), for a forecast's price of N steps."""

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
    step_s: float | None = None
    vocab: int | None = None
    finetune: dict[str, Any] = field(default_factory=dict)
    frozen_measured: bool = True
    frozen_params: int = 0
    frozen_dtype: str = "float32"
    compute_dtype: str = "float32"
    real_share: float = 1.0  # real tokens of those computed (capture.tokens; 1: no padding seen)
    on_cuda: bool = False
    params_small: int | None = None  # elements in tensors of < 4 096 (None: not recorded)
    params_largest: int | None = None  # elements of the largest trained tensor (None: not recorded)
    attn_varlen: bool = False  # its attention kernel reads packed samples' bounds (FlashAttention-2/3)
    #: what the optimizer's update holds beyond its state while it runs (foreach's copy of
    #: the second moments), added at the timeline's last row, the update's moment; a step
    #: on fake tensors measures it apart (0: within the measured categories)
    update_bytes: float = 0.0

    @property
    def hf_causal_lm(self) -> bool:
        """Whether the trained model is a Hugging Face causal LM (``…ForCausalLM``,
        ``…LMHeadModel``), as the fine-tuning record names its class: what fused_ce, liger
        and packing act on."""
        cls = str((self.finetune.get("base_model") or {}).get("class") or "")
        return cls.endswith(("ForCausalLM", "LMHeadModel"))

    @property
    def lora_rank(self) -> int | None:
        """The rank of the run's own LoRA adapters (None: the run trains no LoRA)."""
        ft = self.finetune
        if ft.get("method") in LORA_METHODS and ft.get("rank"):
            return int(ft["rank"])
        return None

    @property
    def quantization(self) -> str | None:
        """How the run's frozen weights were quantized (``nf4``, ``fp4``, ``int8``), or None."""
        return self.finetune.get("quantization") or None

    @property
    def total(self) -> float:
        return float(sum(self.categories.values()))

    @property
    def shape(self) -> tuple[int, int]:
        """(B, T) of the run, 1 where unknown; T = 1 for a model without a token sequence."""
        return self.batch_size or 1, self.seq_len or 1


_CATEGORY_COLUMNS = [f"{c}_bytes" for c in MEMORY_CATEGORIES]
_FROZEN = "frozen_parameters_bytes"
_LOGITS = "logits_bytes"
#: the fine-tuning methods whose trained parameters are LoRA adapters
LORA_METHODS = ("lora", "qlora", "dora")


def _recorded_steps(run: Run) -> pd.DataFrame:
    """The steps with memory categories, as ``record.write.memory_steps`` takes them: those
    that follow another recorded step where there are such."""
    steps = run.steps
    if not set(_CATEGORY_COLUMNS) <= set(steps.columns):
        return steps.iloc[0:0]
    recorded = steps.dropna(subset=_CATEGORY_COLUMNS)
    followers = recorded[recorded["step"].isin(recorded["step"] + 1)]
    return followers if len(followers) else recorded


def measure(run: Run, trace: Trace | None = None) -> Measured:
    """What ``run`` measured that a forecast scales; ``ConfigError`` when it has no memory
    categories (recorded without ``profile_memory`` or with no recorded step)."""
    notes: list[str] = []
    step = peak_step(run.steps)  # the run's peak, chosen before other's carried bytes are moved out
    run = _logits_known(run)
    run, frozen_measured = _frozen_known(run, notes)
    run = _carried_apart(run)
    recorded = _recorded_steps(run)
    if recorded.empty or step is None:
        raise ConfigError(
            "run",
            "has no memory by category: profile with profile_memory=True so at least one step is "
            "recorded (schedule active ≥ 1, and at least wait + warmup + active steps)",
            run.id,
        )
    if trace is None:
        try:
            trace = load_trace(run)
        except RecordError as e:
            notes.append(f"the trace could not be read ({e.problem}): shapes and attention scores unknown")
            trace = parse_events([])
    at_peak_row = run.steps.loc[run.steps["step"] == step, _CATEGORY_COLUMNS].iloc[0]
    categories = dict(zip(MEMORY_CATEGORIES, at_peak_row.astype(float), strict=True))
    ctx = run.context
    batch, seq = ctx.get("batch_size"), ctx.get("seq_len")
    if batch is None or seq is None:  # the shape of the step the categories are measured in
        of_step = trace.events[trace.events["step"] == step]
        found_batch, found_seq = batch_and_seq(of_step if len(of_step) else trace.events)
        batch = batch if batch is not None else found_batch
        seq = seq if seq is not None else found_seq
    dtype, element_bytes, params = _parameters(ctx, categories["parameters"], notes)
    recorded_finetune = ctx.get(FINETUNE_KEY)
    finetune = recorded_finetune if isinstance(recorded_finetune, dict) else {}
    frozen_dtype, frozen_params = _frozen(finetune, dtype, categories["frozen_parameters"])
    ops = trace.events[(cat_in(trace.events, "cpu_op")) & (trace.events["step"] >= 0)]
    blocks, blocks_from = _blocks(ops, trace, ctx)
    if trace.memory.empty and seq:
        notes.append(
            "the trace holds no allocations: attention's [.., T, T] tensors cannot be told apart, so activations "
            "scale linearly with tokens (a calibration run at another sequence length fits a quadratic part)"
        )
    scores = ScoreTimeline(trace, ops, _device_type(run, trace), int(batch or 1))
    at_peak = ScoreBytes(*scores.at_peak(step))
    return Measured(
        run_id=run.id,
        categories=categories,
        timeline=_timeline(run, trace, step, categories, at_peak, scores),
        batch_size=int(batch) if batch else None,
        seq_len=int(seq) if seq else None,
        dtype=dtype,
        element_bytes=element_bytes,
        params=params,
        optimizer=ctx.get("optimizer"),
        world_size=int(ctx.get("world_size") or run.environment.get("world_size") or 1),
        scores=at_peak,
        matrices=_matrices(trace, ops, step),
        blocks=blocks,
        blocks_from=blocks_from,
        hidden=_hidden(ops),
        vocab=_vocab(ops) or run.context.get("vocab_size"),
        finetune=dict(finetune),
        frozen_measured=frozen_measured,
        frozen_params=frozen_params,
        params_small=run.context.get("params_small"),
        params_largest=run.context.get("params_largest"),
        attn_varlen=str(ctx.get("attn_implementation") or "").startswith(
            ("flash_attention_2", "flash_attention_3")
        ),
        frozen_dtype=frozen_dtype,
        compute_dtype=_compute_dtype(finetune, dtype, frozen_dtype),
        toggles={str(t.get("toggle")) for t in ctx.get("toggles") or [] if isinstance(t, dict)},
        traced=not trace.memory.empty,
        untracked_bytes=_untracked(recorded),
        notes=notes,
        step_s=float(run.summary["step_time_median_s"]) if run.summary.get("step_time_median_s") else None,
        real_share=_real_share(run),
        on_cuda=run.environment.get("device") == "cuda",
    )


def _carried_apart(run: Run) -> Run:
    """``run`` with the bytes its steps carried from their start (CUDA: the allocator's
    workspaces, caches and the batch, made before the recording; ``carried_bytes``) taken
    out of ``other``, in a copy: they do not grow with the batch or the sequence, and
    ``_untracked`` keeps them as measured."""
    if "carried_bytes" not in run.steps or not run.steps["carried_bytes"].fillna(0).any():
        return run
    carried = run.steps.set_index("step")["carried_bytes"].fillna(0.0)
    steps = run.steps.assign(other_bytes=run.steps["other_bytes"] - run.steps["carried_bytes"].fillna(0.0))
    memory = run.memory
    if len(memory):
        memory = memory.assign(other_bytes=memory["other_bytes"] - memory["step"].map(carried).fillna(0.0))
    return replace(run, steps=steps, memory=memory)


def _frozen_known(run: Run, notes: list[str]) -> tuple[Run, bool]:
    """``run``, and whether it measured its frozen weights: a run recorded before
    ``frozen_parameters`` existed reads back with the column empty (unknown) beside the
    other categories; it is taken as 0 in a copy, so that its steps still count."""
    others = [c for c in _CATEGORY_COLUMNS if c != _FROZEN]
    steps = run.steps
    if not set(others) <= set(steps.columns):
        return run, True
    rows = steps[others].notna().all(axis=1)
    if not rows.any() or (_FROZEN in steps and steps.loc[rows, _FROZEN].notna().any()):
        return run, True
    notes.append(
        "the run was recorded before frozen weights were measured (no frozen_parameters): they count 0 here; "
        "profile it again to include a LoRA base, a frozen encoder or a reference model"
    )
    steps = steps.assign(**{_FROZEN: np.where(rows, 0.0, np.nan)})
    memory = run.memory.assign(**{_FROZEN: 0.0}) if len(run.memory) else run.memory
    return replace(run, steps=steps, memory=memory), False


def _real_share(run: Run) -> float:
    """The share of the computed tokens that are real (not padding), as the run counted them."""
    s = run.summary
    tokens, real = s.get("tokens_per_step"), s.get("real_tokens_per_step")
    return float(real) / float(tokens) if tokens and real is not None else 1.0


def _logits_known(run: Run) -> Run:
    """``run`` with its logits as measured: a run recorded before the ``logits`` category
    existed reads back with the column empty; its logits are among its activations and
    other tensors, so 0 here, in a copy."""
    steps = run.steps
    if "activations_bytes" not in steps or not len(steps):
        return run
    if _LOGITS in steps and steps[_LOGITS].notna().any():
        return run
    memory = run.memory.assign(**{_LOGITS: 0.0}) if len(run.memory) else run.memory
    return replace(
        run,
        steps=steps.assign(**{_LOGITS: np.where(steps["activations_bytes"].notna(), 0.0, np.nan)}),
        memory=memory,
    )


def _frozen(finetune: Mapping[str, Any], dtype: str, frozen_bytes: float) -> tuple[str, int]:
    """(dtype, elements) of the frozen weights: the fine-tuning record's base dtype and
    count (total less trainable, plus the frozen models beside), else the parameters' dtype
    and the measured bytes at its size."""
    raw = finetune.get("base_dtype")
    try:
        frozen_dtype = dtype_name(raw) if raw else dtype
    except ConfigError:
        frozen_dtype = str(raw)  # packed (uint8, int8): not a dtype a forecast casts to
    total, trainable = finetune.get("total_params"), finetune.get("trainable_params")
    if isinstance(total, (int, float)) and isinstance(trainable, (int, float)):
        others = sum(
            int(m.get("params") or 0) for m in finetune.get("frozen_models") or [] if isinstance(m, dict)
        )
        return frozen_dtype, int(total - trainable) + others
    return frozen_dtype, round(frozen_bytes / DTYPE_BYTES.get(frozen_dtype, 1))


def _compute_dtype(finetune: Mapping[str, Any], dtype: str, frozen_dtype: str) -> str:
    """The dtype a run's activations are in: a LoRA run's base's (its adapters may be fp32
    beside a bf16 base; a 4-bit base computes in bf16), else the parameters'."""
    if finetune.get("method") not in LORA_METHODS:
        return dtype
    if frozen_dtype in DTYPE_BYTES:
        return frozen_dtype
    return "bfloat16"


def _split(categories: Sequence[float], scores: Sequence[float]) -> list[float]:
    """One row of ``PARTS`` from the category bytes (``MEMORY_CATEGORIES``' order) and the
    four score bytes (activations per sample, batch-free, other per sample, batch-free)."""
    p, f, g, o, a, logits, x = categories
    a_s, a_f, x_s, x_f = scores
    a_s, a_f = min(a_s, a), min(a_f, max(0.0, a - a_s))
    x_s, x_f = min(x_s, x), min(x_f, max(0.0, x - x_s))
    return [p, f, g, o, a - a_s - a_f, a_s, a_f, x - x_s - x_f, x_s, x_f, logits]


def _timeline(
    run: Run,
    trace: Trace,
    step: int,
    categories: dict[str, float],
    at_peak: ScoreBytes,
    scores: ScoreTimeline,
) -> np.ndarray:
    """Rows of ``PARTS``: the peak, then every point of ``step``'s memory
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


def _matrices(trace: Trace, ops: pd.DataFrame, step: int) -> dict[tuple[int, int], int]:
    """The weights of the linear layers one forward pass used: (out, in) → how many,
    from ``aten::linear``'s recorded input shapes (empty without shapes)."""
    start = float(first_backward_us(trace).get(step, np.inf))
    linear = ops[(ops["name"] == "aten::linear") & (ops["step"] == step) & (ops["ts_us"] < start)]
    shapes: Counter = Counter()
    for text in linear["input_dims"]:
        dims = input_dims(text)
        if len(dims) > 1 and isinstance(dims[1], list) and len(dims[1]) == 2:
            shapes[(int(dims[1][0]), int(dims[1][1]))] += 1
    return dict(shapes)


def _blocks(ops: pd.DataFrame, trace: Trace, ctx: Mapping[str, Any]) -> tuple[int, str]:
    """How many blocks repeat, and what says so, as the advisor counts them: the model's own
    repeated modules (``context["repeated_blocks"]``), else attention calls per step in the
    trace (one per transformer block), else the run's context; 0 unknown."""
    found = repeated_blocks(ctx)
    if found is not None:
        return found
    n_steps = max(1, len(trace.steps))
    _, _, eager = eager_attention(ops, n_steps)
    calls = max(eager, round(int(ops["name"].eq(SDPA).sum()) / n_steps))
    if calls > 1:
        return calls, "attention layers per step in the trace"
    for key in ("n_layer", "num_hidden_layers"):
        if ctx.get(key):
            return int(ctx[key]), f"run context {key}"
    return 0, ""


def _vocab(ops: pd.DataFrame) -> int | None:
    """The embedding table's rows (the vocabulary: an output layer of that width is not a
    block's linear layer)."""
    for text in ops.loc[ops["name"] == "aten::embedding", "input_dims"].head(1):
        try:
            return int(input_dims(text)[0][0])
        except (IndexError, TypeError, ValueError):
            continue
    return None


def _hidden(ops: pd.DataFrame) -> int | None:
    """The model's width: the embedding table's second side, else the first linear's input."""
    for name, pick in (("aten::embedding", lambda d: d[0][1]), ("aten::linear", lambda d: d[0][-1])):
        for text in ops.loc[ops["name"] == name, "input_dims"].head(1):
            try:
                return int(pick(input_dims(text)))
            except (IndexError, TypeError, ValueError):
                continue
    return None
