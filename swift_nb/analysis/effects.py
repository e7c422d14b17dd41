"""What each toggle does to a step's tensor memory: one formula per effect.

The advisor's predictions, the OOM post-mortem's fixes, the forecast and the comparison's
predicted column all call these, so they cannot disagree. Each function takes bytes (or
elements) of the categories it changes and returns the new figure; how each consumer
gets its inputs (measured at a peak, replayed from a trace, scaled to another batch) is
its own business. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from swift_nb import vocabulary

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

#: what bf16 autocast multiplies fp32 activations by (kept for backward in 16 bits)
AUTOCAST_ACTIVATIONS = 0.5


def autocast_activations(activations: float) -> float:
    """fp32 activations under bf16 autocast: half the bytes (weights, gradients and
    optimizer state stay fp32)."""
    return activations * AUTOCAST_ACTIVATIONS


def autocast_weight_copies(fp32_parameter_bytes: float) -> float:
    """The bf16 copies of the weights that autocast's matmuls keep for backward: P × 2 B."""
    return fp32_parameter_bytes / 2


def sequence_parallel_activations(activations: float, sp_size: int) -> float:
    """Activations per rank when the sequence is split over ``sp_size`` ranks: A / P."""
    return activations / max(1, sp_size)
