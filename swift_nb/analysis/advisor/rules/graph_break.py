"""Graph breaks: torch.compile stopped its graph at a line it cannot trace, ran that line in
Python and started a new graph after it. The finding names each break's line and reason,
and the fix where one is known."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swift_nb.analysis.advisor.evidence import Evidence, Thresholds
from swift_nb.analysis.advisor.findings import Finding

#: (what the reason says, the fix) for the breaks whose fix is known
KNOWN_FIXES = (
    (
        "Tensor.item()",
        "keep the value a tensor (e.g. multiply by h.mean() rather than h.mean().item()), or let dynamo trace "
        "the read: torch._dynamo.config.capture_scalar_outputs = True",
    ),
    (
        "dynamic shape operator",
        "let dynamo trace operators whose output size depends on the data (nonzero, unique, masked_select): "
        "torch._dynamo.config.capture_dynamic_output_shape_ops = True",
    ),
    (
        "builtin: print",
        "move the print (or logging) out of the compiled function, or behind `if not torch.compiler.is_compiling()`",
    ),
    (
        "Data-dependent branching",
        "replace the `if` on a tensor's value with torch.where (or torch.cond), or move it out of the compiled function",
    ),
)


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    c = ev.compiled
    if c is None:
        return None
    breaks = c.of("graph_break")
    if not breaks:
        return None
    first = breaks[0]
    parts = [f"{_where(e)}: {e.get('reason')} — fix: {fix_of(e)}" for e in breaks]
    return Finding(
        id="graph_break",
        title=(
            f"torch.compile's graph breaks at {_where(first)}: {first.get('reason')}"
            if len(breaks) == 1
            else f"torch.compile's graph breaks {len(breaks)}×, first at {_where(first)}: {first.get('reason')}"
        ),
        evidence={
            "graph_breaks": len(breaks),
            "where": [e.get("where") for e in breaks],
            "reasons": [e.get("reason") for e in breaks],
        },
        suggestion=(
            "Each break ends the graph: the line runs in plain Python, with a guard check and a new graph after "
            "it, and nothing fuses across it. " + "; ".join(parts) + "."
        ),
        predicted_effect=(
            f"{len(breaks) + 1} graphs per call become 1: the Python round trip and guard check at each break go, "
            "and the ops on both sides can fuse"
        ),
        formula="graphs per call = breaks + 1; each boundary costs a return to Python and stops fusion",
        severity="warning",
    )


def fix_of(event: Mapping[str, Any]) -> str:
    """The fix for a graph break: the known one for its reason, else dynamo's own hint,
    else restructuring the line."""
    reason = str(event.get("reason") or "")
    for says, fix in KNOWN_FIXES:
        if says in reason:
            return fix
    hints = [h for h in event.get("hints") or () if h]
    if hints:
        return hints[0].rstrip(".")
    return (
        "restructure the line so that it stays in torch operations, or move it out of the compiled function"
    )


def _where(event: Mapping[str, Any]) -> str:
    return str(event.get("where") or "an unknown line")
