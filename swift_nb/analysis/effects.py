"""What each toggle does to a step's tensor memory: one formula per effect.

The advisor's predictions, the OOM post-mortem's fixes, the forecast and the comparison's
predicted column all call these, so they cannot disagree. Each function takes bytes (or
elements) of the categories it changes and returns the new figure; how each consumer
gets its inputs (measured at a peak, replayed from a trace, scaled to another batch) is
its own business. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from swift_nb import vocabulary
from swift_nb.core.units import fmt_bytes

# -- optimizer state -----------------------------------------------------------------------


class OptimizerState(NamedTuple):
    """Per parameter element: ``states`` tensors, each element ``element_bytes`` (None:
    as the parameters'); ``factored``: Adafactor's row and column second moments."""

    states: int
    element_bytes: int | None = None
    factored: bool = False


#: Optimizer classes by name (``run.context["optimizer"]``); SGD is taken with momentum
#: (a run that used SGD says itself whether it kept momentum: its measured state).
OPTIMIZERS: dict[str, OptimizerState] = {
    **dict.fromkeys(
        ("Adam", "AdamW", "NAdam", "RAdam", "Adamax", "GaLoreAdamW", "Adadelta"), OptimizerState(2)
    ),
    **dict.fromkeys(("SGD", "RMSprop", "Adagrad"), OptimizerState(1)),
    **dict.fromkeys(("Adam8bit", "AdamW8bit", "PagedAdam8bit", "PagedAdamW8bit"), OptimizerState(2, 1)),
    "Adafactor": OptimizerState(1, None, factored=True),
}
#: the optimizers GaLore replaces (its AdamW keeps Adam's two moments, projected)
ADAM_LIKE = ("Adam", "AdamW", "GaLoreAdamW")


#: bitsandbytes' 8-bit optimizers keep one fp32 absmax per block of this many elements
BLOCK_8BIT = 256


def adam8bit_state(large: Sequence[float] | float, small: float) -> float:
    """Bytes of AdamW8bit's state: for each tensor of ≥ 4 096 elements (``large``:
    their sizes, or their total), two uint8 moments and two fp32 absmax per block of 256;
    two fp32 moments for the ``small`` ones' elements; and its two 256-entry fp32
    quantization maps, shared by every tensor."""
    sizes = [float(large)] if isinstance(large, (int, float)) else [float(n) for n in large]
    blocks = sum(math.ceil(n / BLOCK_8BIT) for n in sizes)
    return 2 * sum(sizes) + 2 * 4 * blocks + 2 * 4 * small + (2 * 256 * 4 if sizes else 0)


def states_per_parameter(optimizer: str | None) -> float:
    """State tensors per parameter of ``optimizer`` (0 when unknown)."""
    state = OPTIMIZERS.get(optimizer or "")
    return float(state.states) if state is not None else 0.0


# -- GaLore --------------------------------------------------------------------------------

#: GaLore's rank when none is given (the toggle's default)
GALORE_RANK: int = vocabulary.TOGGLES["galore"].defaults()["rank"]


@dataclass(frozen=True)
class GaLoreState:
    """GaLore AdamW's state in elements: ``elements`` in all; ``projected`` weight matrices
    (both sides above the rank) holding ``projected_params`` parameters, whose moments take
    ``low_rank`` elements instead of ``2 × projected_params``; every other parameter keeps
    Adam's two."""

    elements: float
    projected: int
    projected_params: float
    low_rank: float


def galore_state(
    shapes: Mapping[tuple[int, int], int], params: float, rank: int = GALORE_RANK
) -> GaLoreState:
    """GaLore's state for weight matrices ``shapes`` (``(m, n)`` → how many) among ``params``
    parameters: an m×n weight with both sides above the rank (m ≤ n) keeps 2·r·n + m·r
    (two r×n moments and the m×r projection) instead of 2·m·n."""
    projected = {s: k for s, k in shapes.items() if min(s) > rank}
    in_projected = sum(a * b * k for (a, b), k in projected.items())
    low_rank = sum((2 * rank * max(a, b) + min(a, b) * rank) * k for (a, b), k in projected.items())
    return GaLoreState(
        low_rank + 2 * (params - in_projected), sum(projected.values()), in_projected, low_rank
    )


def galore_square_ratio(params: float, rank: int = GALORE_RANK) -> float:
    """GaLore's state over Adam's when the weights are taken as square d×d matrices with
    d = √params (at least rank + 1): (2·r·d + d·r) / (2·d²)."""
    d = max(rank + 1, int(math.sqrt(params or 1.0)))
    return (2 * rank * d + d * rank) / (2 * d * d)


# -- gradient checkpointing ----------------------------------------------------------------


@dataclass(frozen=True)
class Checkpointing:
    """Activations under checkpointing: ``kept`` through the step (the blocks not
    checkpointed), ``recomputed`` alive again while backward recomputes one block, of
    ``checkpointed`` of ``blocks`` blocks."""

    kept: float
    recomputed: float
    checkpointed: int
    blocks: int

    @property
    def activations(self) -> float:
        """At the peak: what is kept and one block recomputed."""
        return self.kept + self.recomputed


def checkpointing(activations: float, blocks: int, checkpointed: int | None = None) -> Checkpointing:
    """``checkpointed`` of ``blocks`` repeated blocks (all by default) recompute their
    activations (≈ A/L each) in backward instead of keeping them: A − A·c/L kept, and one
    block's A/L alive again while backward recomputes it (beside its backward temporaries,
    which a measured peak already holds). The blocks' inputs, which checkpointing keeps,
    are the caller's to add where it knows their size."""
    blocks = max(1, blocks)
    checkpointed = blocks if checkpointed is None else min(checkpointed, blocks)
    return Checkpointing(
        activations - activations * checkpointed / blocks, activations / blocks, checkpointed, blocks
    )


def every_nth(blocks: int, every_n: int) -> int:
    """Blocks checkpointed when every ``every_n``-th of ``blocks`` is."""
    return math.ceil(blocks / max(1, every_n))


def checkpointed_peak(peak: float, activations: float, blocks: int, checkpointed: int | None = None) -> float:
    """Peak tensor bytes with ``checkpointed`` of ``blocks`` blocks checkpointed (``checkpointing``)."""
    return peak - activations + checkpointing(activations, blocks, checkpointed).activations


# -- FlashAttention ------------------------------------------------------------------------


def score_matrix_bytes(score_shape: Sequence[int]) -> int:
    """Bytes of one fp32 [.., T, T] score matrix of ``score_shape``."""
    t = int(score_shape[-1]) if score_shape else 0
    lead = int(math.prod(score_shape[:-2])) if len(score_shape) > 2 else 1
    return lead * t * t * 4


def eager_score_bytes(score_shape: Sequence[int], layers: int) -> int:
    """[.., T, T] bytes eager attention holds at the peak when the trace has no
    allocations to replay: the probabilities each of ``layers`` layers keeps for backward
    and two gradient buffers of the backward of one, (L + 2) × B·H × T² × 4."""
    return score_matrix_bytes(score_shape) * (max(1, layers) + 2)


def without_scores(nbytes: float, score_bytes: float) -> float:
    """``nbytes`` with fused attention: no [.., T, T] scores, probabilities, masks or their
    gradients are materialised (flash keeps O(B·H·T))."""
    return max(0.0, nbytes - score_bytes)


# -- bf16 autocast, sequence parallelism -----------------------------------------------------

#: what bf16 autocast multiplies fp32 activations by: the matmuls' outputs (and what is
#: computed from them) are kept in 16 bits, while the norms' outputs, the softmax and the
#: fp32 residual stream stay fp32. Measured under autocast on CPU: 0.62 on the demo GPT
#: (tests/integration/test_bf16.py), 0.55-0.60 on the three GPT shapes of benchmarks/plan.py.
AUTOCAST_ACTIVATIONS = 0.6


def autocast_activations(activations: float) -> float:
    """fp32 activations under bf16 autocast: ``AUTOCAST_ACTIVATIONS`` of the bytes (weights,
    gradients and optimizer state stay fp32)."""
    return activations * AUTOCAST_ACTIVATIONS


def autocast_weight_copies(fp32_parameter_bytes: float) -> float:
    """The bf16 copies of the weights that autocast's matmuls keep for backward: P × 2 B."""
    return fp32_parameter_bytes / 2


def fused_ce_logits(tokens: float, vocab: int, hidden: int | None, cuda: bool) -> float:
    """Bytes of the loss's logits at the peak under ``fused_ce``, for ``tokens`` predicted
    (real, labelled) tokens. On the CPU, cut-cross-entropy's torch_compile path drops the
    ignored positions and forms one fp32 copy of the rest's logits (measured: 129.8 MiB for
    224 tokens × 151 936). On CUDA, Liger's fused linear cross-entropy holds one chunk of
    ``next_pow2(tokens / ceil(V / hidden))`` tokens' logits and their gradient, in fp32."""
    if not cuda or not hidden:
        return tokens * vocab * 4.0
    chunks = math.ceil(vocab / hidden)
    chunk = 1 << max(0, math.ceil(math.log2(max(1.0, tokens / chunks))))
    return 2.0 * chunk * vocab * 4.0


#: bytes bitsandbytes' CPU 8-bit update holds per element of the tensor it updates: both
#: moments dequantized to fp32, the update and its temporaries (measured on bitsandbytes
#: 0.45–0.49: 20.0 MiB for a 1024 × 1024 tensor, alone or among others, each tensor's freed
#: before the next)
ADAM8BIT_CPU_UPDATE_BYTES = 20


def adam8bit_update(largest: int | None, cuda: bool) -> tuple[float, str]:
    """(bytes, how) that bitsandbytes' AdamW8bit holds beyond its state while it updates:
    nothing on CUDA (one fused kernel, in place); on the CPU, tensor by tensor,
    ``ADAM8BIT_CPU_UPDATE_BYTES`` per element of the ``largest`` tensor it quantizes (None:
    not recorded, taken as 0 and said)."""
    if cuda:
        return 0.0, "AdamW8bit updates in one CUDA kernel, holding nothing beyond its state"
    if largest is None:
        return (
            0.0,
            "AdamW8bit's CPU update holds its largest tensor's moments in fp32; its size was not recorded",
        )
    value = float(ADAM8BIT_CPU_UPDATE_BYTES * largest)
    return value, (
        f"AdamW8bit's CPU update dequantizes each tensor's moments to fp32, one tensor at a time: "
        f"{ADAM8BIT_CPU_UPDATE_BYTES} B × {largest:,} elements of the largest = {fmt_bytes(value)}"
    )


def packing_mask(real_tokens: float, element_bytes: int) -> float:
    """Bytes of packing's additive block-diagonal causal mask for ``real_tokens`` in one row
    (off FlashAttention's variable-length kernel): N × N elements of the model's dtype.
    While it is built, three N × N boolean temporaries live beside it for a moment."""
    return real_tokens * real_tokens * element_bytes


def sequence_parallel_activations(activations: float, sp_size: int) -> float:
    """Activations per rank when the sequence is split over ``sp_size`` ranks: A / P."""
    return activations / max(1, sp_size)


# -- LoRA, QLoRA -------------------------------------------------------------------------

#: bitsandbytes' 4-bit layout: two elements a byte, one absmax per block of 64 elements
#: (fp32; with double quantization one byte, its fp32 scale per 256 blocks), and a 16-entry
#: fp32 code per weight (256 entries more for the second level)
NF4_BLOCK = 64
NF4_DOUBLE_BLOCK = 256
NF4_CODE_BYTES = 16 * 4
NF4_DOUBLE_CODE_BYTES = 256 * 4 + 4  # the second code and the absmax's offset
#: LoRA's rank when none is given (the toggle's default)
LORA_RANK: int = vocabulary.TOGGLES["lora"].defaults()["r"]
#: bytes per adapter element: fp32 even on a half-precision base, as peft's get_peft_model
#: and the lora toggle make them
LORA_ADAPTER_BYTES = 4
#: parameters of one transformer block per d² when its linear layers' shapes are unknown:
#: q, k, v, o d×d and the MLP's d×4d and 4d×d
BLOCK_PARAMS_PER_D2 = 12


def lora_params(shapes: Mapping[tuple[int, int], int], rank: int) -> int:
    """Elements of LoRA adapters of rank ``rank`` on the linear layers ``shapes`` (``(out, in)``
    → how many): A is r×in and B out×r, r·(in + out) per layer."""
    return int(sum(rank * (a + b) * k for (a, b), k in shapes.items()))


def block_linears(params: float, blocks: int) -> dict[tuple[int, int], int]:
    """The linear layers of ``blocks`` transformer blocks (at least one) holding ``params``
    parameters, when no shapes are known (``(out, in)`` → how many): each block ≈ 12·d²
    (``BLOCK_PARAMS_PER_D2``), d = √(P / 12·L)."""
    blocks = max(1, blocks)
    d = max(1, math.isqrt(int(params // (BLOCK_PARAMS_PER_D2 * blocks))))
    return {(d, d): 4 * blocks, (4 * d, d): blocks, (d, 4 * d): blocks}


def adapter_optimizer_state(elements: float, optimizer: str | None) -> float:
    """Bytes of ``optimizer``'s state (Adam's when unknown) when it trains LoRA adapters of
    ``elements`` elements alone: states × elements × bytes per element, the adapters' fp32
    (``LORA_ADAPTER_BYTES``) unless the optimizer keeps its own (8-bit). Adam's 4-byte step
    counter per tensor is left out."""
    state = OPTIMIZERS.get(optimizer or "") or OPTIMIZERS["AdamW"]
    return state.states * elements * (state.element_bytes or LORA_ADAPTER_BYTES)


def lora_activations(
    tokens: float, rank: int, layers: int, element_bytes: float, dropout_inputs: float = 0.0
) -> float:
    """What the adapters of ``layers`` linear layers add to the activations for ``tokens``
    tokens: each keeps x·A ([.., r]) for B's gradient; with dropout its dropped input and
    mask (``dropout_inputs``: the adapted layers' input widths summed) for A's. Their input x
    is the base layer's, which a full fine-tune keeps too."""
    kept = rank * layers * element_bytes
    if dropout_inputs:
        kept += dropout_inputs * (element_bytes + 1)
    return tokens * kept


def nf4_bytes(shapes: Mapping[tuple[int, int], int], double_quant: bool = False) -> float:
    """Bytes of the weights ``shapes`` quantized to 4 bits by bitsandbytes (NF4 or FP4):
    n/2 packed, one fp32 absmax per 64 elements (double quantization: one byte, and an fp32
    per 256 blocks) and the code, per weight."""
    total = 0.0
    for (a, b), k in shapes.items():
        n = a * b
        blocks = math.ceil(n / NF4_BLOCK)
        if double_quant:
            state = blocks + 4 * math.ceil(blocks / NF4_DOUBLE_BLOCK) + NF4_CODE_BYTES + NF4_DOUBLE_CODE_BYTES
        else:
            state = 4 * blocks + NF4_CODE_BYTES
        total += k * (math.ceil(n / 2) + state)
    return total


def nf4_bits_per_element(double_quant: bool = False) -> float:
    """4-bit weights' bits per element, state included (large weights): 4.5, or ≈ 4.127
    with double quantization."""
    if double_quant:
        return 4 + 8 / NF4_BLOCK + 32 / (NF4_BLOCK * NF4_DOUBLE_BLOCK)
    return 4 + 32 / NF4_BLOCK


@dataclass(frozen=True)
class LoRA:
    """Adapters a configuration trains instead of its model's weights: ``rank``, ``targets``
    (module names; empty: the attention and MLP linear layers), ``dropout`` on their input,
    and whether the frozen base is ``quantized`` to 4-bit NF4 (QLoRA)."""

    rank: int
    targets: tuple[str, ...]
    dropout: float
    quantized: bool

    @property
    def name(self) -> str:
        return "qlora" if self.quantized else "lora"


# -- a measured run with one toggle -------------------------------------------------------


def toggle_peak(
    toggle: str,
    peak: float,
    categories: Mapping[str, Any],
    details: Mapping[str, Any],
    evidence: Mapping[str, Mapping[str, Any]],
) -> float | None:
    """The peak tensor bytes a measured run would have with ``toggle`` alone, or None when
    the numbers do not tell. ``categories``: its ``<category>_bytes`` at the peak;
    ``details``: what the toggle reported applying it (``ToggleReport.details``);
    ``evidence``: the run's advisor findings' evidence by finding id (the peak without
    score-sized tensors, the repeated blocks)."""
    act = categories.get("activations_bytes") or 0.0
    if toggle in ("galore", "optim_8bit") and "optimizer_state_bytes_after" in details:
        return (
            peak - (categories.get("optimizer_state_bytes") or 0.0) + details["optimizer_state_bytes_after"]
        )
    if toggle == "grad_checkpointing" and details.get("checkpointed_blocks"):
        checkpointed = int(details["checkpointed_blocks"])
        # the trace's count of blocks where the advisor has one: the toggle may skip some (every_n)
        # LoRA runs get lora_activations in the activations finding's place, with its evidence
        found = evidence.get("activations") or evidence.get("lora_activations") or {}
        blocks = int(found.get("blocks") or checkpointed)
        return checkpointed_peak(peak, act, max(blocks, checkpointed), checkpointed)
    if toggle == "flash_attention" and "peak_saved_bytes" in evidence.get("eager_attention", {}):
        return peak - evidence["eager_attention"]["peak_saved_bytes"]
    return None


# -- a step that did not fit ------------------------------------------------------------------


@dataclass(frozen=True)
class StepFix:
    """A toggle (or two, comma-separated) applied to a step's need: its activations and
    optimizer-state bytes with it, what it changes in words, and the formula."""

    toggles: str
    change: str
    activations: float
    state: float
    formula: str


def step_fixes(
    activations: float,
    scores: float,
    blocks: int | None,
    fp32_activations: bool,
    state: float,
    parameters: float,
    optimizer: str | None,
) -> list[StepFix]:
    """The toggles that would shrink a step needing ``activations`` (``scores`` of them
    [.., T, T]) over ``blocks`` repeated blocks and ``state`` optimizer-state bytes for
    ``parameters`` parameter bytes, each with what it leaves. Checkpointing keeps the
    blocks' inputs, taken here as one block's activations each (their width is unknown)."""
    out = []
    flash = without_scores(activations, scores)
    if scores > 0:
        out.append(
            StepFix(
                "flash_attention",
                "FlashAttention (fused attention: no T×T scores kept)",
                flash,
                state,
                f"activations − the [.., T, T] scores ({fmt_bytes(scores)})",
            )
        )
    if blocks:
        kept = checkpointing(activations, blocks).activations + activations / blocks
        formula = f"activations × 2/{blocks}: one block's kept, and each block's input"
        out.append(StepFix("grad_checkpointing", "gradient checkpointing", kept, state, formula))
        if scores > 0:
            both = checkpointing(flash, blocks).activations + flash / blocks
            out.append(
                StepFix(
                    "flash_attention,grad_checkpointing",
                    "FlashAttention and gradient checkpointing",
                    both,
                    state,
                    f"(activations − scores) × 2/{blocks}",
                )
            )
    if fp32_activations:
        out.append(
            StepFix(
                "bf16_autocast",
                "bf16 autocast",
                autocast_activations(activations),
                state,
                f"fp32 activations × {AUTOCAST_ACTIVATIONS:g} (matmul outputs in bf16; norms, softmax and the residual stream fp32)",
            )
        )
    if state > 0 and optimizer in ADAM_LIKE:  # GaLore replaces Adam and AdamW
        ratio = galore_square_ratio(parameters / 4)
        out.append(
            StepFix(
                "galore",
                "GaLore (low-rank optimizer state)",
                activations,
                state * ratio,
                f"optimizer state × {ratio:.2f} (rank {GALORE_RANK} on square d×d weights, d = √parameters)",
            )
        )
    return out


# -- a configuration's toggles -----------------------------------------------------------


@dataclass(frozen=True)
class Applied:
    """A configuration's toggles (``{id: parameters}``, as ``swift_nb.vocabulary`` parses
    them) as the memory formulas ask about them. ``measured``: the toggles the measured run
    had already, whose effect is in its numbers and is not applied twice."""

    toggles: Mapping[str, Mapping[str, Any]]
    measured: Collection[str] = ()

    def _new(self, toggle_id: str) -> bool:
        return toggle_id in self.toggles and toggle_id not in self.measured

    @property
    def packing(self) -> bool:
        """Only the real tokens computed (``packing``, new: not in the measured run)."""
        return self._new("packing")

    @property
    def fused_ce(self) -> bool:
        """The loss's logits never held whole (``fused_ce`` or ``liger``, new: not in the
        measured run)."""
        return (self._new("fused_ce") or self._new("liger")) and not {"fused_ce", "liger"} & set(
            self.measured
        )

    @property
    def optim_8bit(self) -> bool:
        """Adam/AdamW's moments in 8 bits (``optim_8bit``, new: not in the measured run)."""
        return self._new("optim_8bit")

    @property
    def activation_offload(self) -> bool:
        """Saved tensors in host memory between forward and backward (new)."""
        return self._new("activation_offload")

    @property
    def fused_attention(self) -> bool:
        """No [.., T, T] tensors (FlashAttention)."""
        return "flash_attention" in self.toggles

    @property
    def galore_rank(self) -> int | None:
        """GaLore's rank, when it replaces the optimizer."""
        return int(self.toggles["galore"]["rank"]) if "galore" in self.toggles else None

    @property
    def lora(self) -> LoRA | None:
        """The adapters of ``lora`` or ``qlora`` (its targets ``auto``: none named)."""
        for toggle_id, quantized in (("qlora", True), ("lora", False)):
            if toggle_id in self.toggles:
                p = self.toggles[toggle_id]
                named = str(p.get("targets") or "auto")
                targets = () if named == "auto" else tuple(t.strip() for t in named.split("|") if t.strip())
                return LoRA(int(p.get("r", 8)), targets, float(p.get("dropout") or 0.0), quantized)
        return None

    @property
    def checkpointing(self) -> bool:
        return "grad_checkpointing" in self.toggles

    @property
    def checkpoint_every(self) -> int | None:
        """Every how many blocks one is checkpointed, when checkpointing is new."""
        return int(self.toggles["grad_checkpointing"]["every_n"]) if self._new("grad_checkpointing") else None

    @property
    def autocast(self) -> bool:
        """Activations in bf16 under autocast (new or measured)."""
        return "bf16_autocast" in self.toggles

    @property
    def new_autocast(self) -> bool:
        return self._new("bf16_autocast")

    @property
    def sp_size(self) -> int:
        """Ranks the sequence is split over (1: none)."""
        return int(self.toggles.get("sequence_parallel", {}).get("sp_size", 1))

    @property
    def shard_stage(self) -> int:
        """ZeRO's stage: 1 optimizer state, 2 + gradients, 3 + parameters sharded (FSDP:
        3); 0 when nothing is sharded."""
        if "fsdp" in self.toggles:
            return 3
        return int(self.toggles.get("zero", {}).get("stage", 0))

    def shards(self, world_size: int) -> tuple[int, int, int]:
        """How many ways parameters, gradients and optimizer state are split."""
        n, stage = world_size, self.shard_stage
        return (n if stage >= 3 else 1, n if stage >= 2 else 1, n if stage >= 1 else 1)


# -- a configuration's step time ---------------------------------------------------------------


def step_factor(
    toggle_ids: Collection[str], cuda: bool, has: Collection[str] | None = None, real_share: float = 1.0
) -> tuple[float, list[str]]:
    """What ``toggle_ids`` together multiply a step's time by (each one's ``StepCost``, from
    its vocabulary entry, multiplied), and one reason per toggle. ``cuda``: the target is a
    GPU; ``has``: what the run has of what toggles act on (``Entry.acts_on``; None: all of
    it); ``real_share``: the real tokens' share (packing computes only those)."""
    factor, why = 1.0, []
    for t in toggle_ids:
        entry = vocabulary.TOGGLES.get(t)
        cost = entry.step if entry is not None else vocabulary.StepCost()
        f, reason = cost.factor, cost.reason
        if cost.per_real_share:
            f, reason = real_share, f"{reason} (× {real_share:.2f})"
        elif not cuda and cost.cpu is not None:
            f, reason = cost.cpu
        elif has is not None and cost.without is not None and entry is not None and entry.acts_on not in has:
            f, reason = cost.without
        factor *= f
        why.append(f"{t} ×{f:.2f}: {reason}")
    return factor, why
