"""Optimizer state: a large share of the peak; GaLore keeps Adam's moments in a low-rank
space."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from swift_nb.analysis import effects
from swift_nb.analysis.advisor import frameworks
from swift_nb.analysis.advisor.evidence import Evidence, Thresholds
from swift_nb.analysis.advisor.frameworks import Recorded
from swift_nb.analysis.advisor.words import pct
from swift_nb.analysis.findings import Finding
from swift_nb.units import fmt_bytes


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    opt = ev.at_peak("optimizer_state")
    if not ev.peak_bytes or opt / ev.peak_bytes < th.optimizer_share:
        return None
    shapes = Counter((int(m), int(n)) for m, n in context.get("matrix_shapes") or [])
    rank = effects.GALORE_RANK
    if shapes:
        in_matrices = sum(m * n * k for (m, n), k in shapes.items())
        after = effects.galore_state(shapes, in_matrices, rank).elements * 4
        effect = f"optimizer state of the 2-D weights ≈ {fmt_bytes(after)} instead of {fmt_bytes(2 * in_matrices * 4)}"
    else:
        ratio = effects.galore_square_ratio(ev.at_peak("parameters") / 4, rank)
        effect = f"optimizer state ≈ ×{ratio:.2f} for square d×d weights (rank {rank})"
    return Finding(
        id="optimizer_state",
        title=f"Optimizer state is {pct(opt / ev.peak_bytes)} % of peak tensor memory",
        evidence={
            "optimizer_state_bytes": opt,
            "peak_bytes": ev.peak_bytes,
            "optimizer_pct": pct(opt / ev.peak_bytes),
        },
        suggestion=frameworks.phrased(context, fix)
        or (
            "Keep Adam's moments in a low-rank space: GaLore on the 2-D weight matrices "
            f"(rank {rank}, update_proj_gap=200), or an 8-bit optimizer."
        ),
        toggle="galore",
        predicted_effect=effect,
        formula="per m×n weight (m ≤ n): Adam state 2·m·n → 2·r·n + m·r (projection P is m×r)",
    )


def fix(rec: Recorded) -> str | None:
    if not rec.is_trainer:
        return None
    return (
        f"Keep Adam's moments in a low-rank space: "
        f"{frameworks.set_arguments(rec, optim='galore_adamw', optim_target_modules=['attn', 'mlp'])} (GaLore on the nn.Linear "
        "weights of the modules those names match), or optim='adamw_bnb_8bit' for 8-bit moments."
    )
