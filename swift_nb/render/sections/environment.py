"""Where the run ran (versions, host, devices) and the context it recorded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swift_nb.record import FINETUNE_KEY, TRAINER_KEY
from swift_nb.render.html import empty, evidence_html
from swift_nb.render.sections.base import Part, ReportInputs, SectionKind
from swift_nb.render.tables import finetune_text


def _toggles_text(toggles: Any) -> str:
    """``flash_attention, galore (rank=64)``: the toggles the run had, as specs."""
    if not isinstance(toggles, list) or not toggles:
        return "none"
    out = []
    for t in toggles:
        if not isinstance(t, Mapping):
            out.append(str(t))
            continue
        params = t.get("params") or {}
        spec = str(t.get("toggle"))
        out.append(spec + (f" ({', '.join(f'{k}={v}' for k, v in params.items())})" if params else ""))
    return ", ".join(out)


def _trainer_text(info: Any) -> str:
    """``Trainer `trainer` (transformers)``: what drove the loop."""
    if not isinstance(info, Mapping):
        return str(info)
    name = f" `{info['variable']}`" if info.get("variable") else ""
    return f"{info.get('class') or 'Trainer'}{name} ({info.get('framework', 'unknown framework')})"


#: context entries whose record is a structure, in words
READABLE = {
    "toggles": _toggles_text,
    FINETUNE_KEY: lambda v: finetune_text(dict(v)) if isinstance(v, Mapping) else str(v),
    TRAINER_KEY: _trainer_text,
}


def context_rows(context: Mapping[str, Any]) -> dict[str, Any]:
    """The run's context as a reader reads it: structures the capture records in words."""
    return {k: READABLE[k](v) if k in READABLE else v for k, v in context.items()}


def build(inputs: ReportInputs) -> list[Part]:
    run = inputs.run
    return [
        evidence_html(run.environment) if run.environment else empty("Not recorded."),
        "<h3>Context</h3>",
        evidence_html(context_rows(run.context)) if run.context else empty("Not recorded."),
    ]


# In report.html only: the notebook's Files tab shows it, its static outputs do not.
SECTION = SectionKind("Environment", tab="Files", build=build, static=False)
