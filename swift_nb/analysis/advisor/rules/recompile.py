"""Recompiles: a guard of a compiled frame failed, so torch.compile traced and compiled the
frame again. The finding names the guard and the change that keeps one graph."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from swift_nb.analysis.advisor.evidence import Evidence, Thresholds
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.words import pct
from swift_nb.core.units import fmt_seconds

#: dynamo's guard on a tensor's size: ``tensor 'x' size mismatch at index 0. expected 8, actual 12``
SIZE = re.compile(
    r"tensor '(?P<name>[^']+)' size mismatch at index (?P<dim>\d+)\. expected (?P<was>\d+), actual (?P<now>\d+)"
)
#: the function dynamo compiles for the rest of ``fn`` after a graph break at ``line``
RESUME = re.compile(r"torch_dynamo_resume_in_(?P<fn>.+)_at_(?P<line>\d+)")
#: a Python value baked into the graph as a constant: ``___stack0 == 0.25``, ``L['n'] == 3``
VALUE = re.compile(r"^(?P<name>\S+) == (?P<value>\S+)$")


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    c = ev.compiled
    if c is None:
        return None
    recompiles = c.of("recompile")
    if not recompiles:
        return None
    seconds = sum(float(e.get("seconds") or 0.0) for e in recompiles)
    sizes = [(e, m) for e in recompiles if (m := SIZE.search(e.get("reason") or ""))]
    lines = [_line(e) for e in recompiles]
    first = recompiles[0]
    if sizes:
        e, m = sizes[0]
        title = (
            f"torch.compile recompiled {len(recompiles)}× ({fmt_seconds(seconds)}): tensor '{m['name']}' changed size "
            f"at dim {m['dim']} ({m['was']} → {m['now']}) at step {e['step']}"
        )
        fix = (
            f"A size change makes dynamo compile again for the new size. Compile for any size from the start: "
            f"torch.compile(model, dynamic=True), or mark the dimension before the first call: "
            f"{_mark_dynamic(m['name'], m['dim'])}. If the sizes are few and known, pad the "
            "batches to one of them instead (a last, smaller batch: drop_last=True)."
        )
        toggle = "torch_compile"
        values = [e for e in recompiles if VALUE.match((e.get("reason") or "").strip())]
        if values:
            fix += " " + _value_fix(values[0].get("reason") or "")
    else:
        title = f"torch.compile recompiled {len(recompiles)}× ({fmt_seconds(seconds)}): guard `{first.get('reason')}` failed"
        fix = _value_fix(first.get("reason") or "")
        toggle = None
    return Finding(
        id="recompile",
        title=title,
        evidence={
            "recompiles": len(recompiles),
            "recompile_s": round(seconds, 6),
            "recompile_pct_of_steps": pct(seconds / c.steps_s) if c.steps_s else None,
            "guards": [e.get("reason") for e in recompiles],
        },
        suggestion="Each recompile, the guard that failed and where: " + "; ".join(lines) + ". " + fix,
        toggle=toggle,
        predicted_effect=f"−{fmt_seconds(seconds)} of compiling (the recompiles), and no new compile when the size changes again",
        formula="t_compile' = t_compile − Σ t_recompile: one graph, with symbolic sizes, serves every size",
        severity="warning",
    )


def _line(e: Mapping[str, Any]) -> str:
    where = f" at {e['where']}" if e.get("where") else ""
    fn = f" in {_function(e['function'])}" if e.get("function") else ""
    return f"step {e.get('step')}: `{e.get('reason')}`{fn}{where} ({fmt_seconds(float(e.get('seconds') or 0.0))})"


def _function(name: str) -> str:
    """A compiled function's name; dynamo's resume functions as what they are."""
    m = RESUME.fullmatch(name)
    return f"{m['fn']} after its graph break at line {m['line']}" if m else name


def _mark_dynamic(guard_name: str, dim: str) -> str:
    """The mark_dynamic call for a guarded tensor, by the user's name for it (``L['x']``,
    ``x``), or the call's argument it was (``args[0]``: a module torch.compile wrapped)."""
    m = re.fullmatch(r"L\['([^']+)'\]", guard_name)
    name = m.group(1) if m else guard_name
    arg = re.fullmatch(r"args\[(\d+)\]", name)
    if arg:
        return f"torch._dynamo.mark_dynamic(x, {dim}) on the tensor x passed as the compiled call's argument {arg.group(1)}"
    return f"torch._dynamo.mark_dynamic({name}, {dim})"


def _value_fix(reason: str) -> str:
    m = VALUE.match(reason.strip())
    if m and m["name"].startswith("___stack"):
        return (
            f"A Python number ({m['value']}) crossed a graph break and was baked into the next graph as a constant; "
            "each new value compiles again. Keep it a tensor (no .item() / float() on it), or let dynamo trace the "
            "read: torch._dynamo.config.capture_scalar_outputs = True."
        )
    if m:
        return (
            f"The Python value {m['name']} was baked into the graph as the constant {m['value']}; each new value "
            "compiles again. Pass it as a tensor, or keep it constant across calls."
        )
    return (
        "What the guard checks changed between calls; keep it the same, or see every guard that failed with "
        "TORCH_LOGS=recompiles."
    )
