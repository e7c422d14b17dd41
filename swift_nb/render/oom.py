"""The "Out of memory" part of a report: what was live at the failure, where it happened,
the largest tensors, and the fixes that would make the failed step fit."""

from __future__ import annotations

from html import escape

from swift_nb.analysis.oom import Diagnosis, diagnose
from swift_nb.core.units import fmt_bytes
from swift_nb.record import MEMORY_CATEGORIES, OutOfMemory, Run

TITLE = "Out of memory"


def headline(oom: OutOfMemory) -> str:
    """One sentence: where it failed, what it asked for, against what."""
    where = f"step {oom.step}" if oom.step is not None else "the run"
    if oom.phase:
        where += f", {oom.phase}"
    if oom.module:
        where += f", in {oom.module}"
    asked = f"asking for {fmt_bytes(oom.requested_bytes)}" if oom.requested_bytes else "allocating"
    against = ""
    if oom.capacity_bytes:
        against = f" of {fmt_bytes(oom.capacity_bytes)} ({oom.capacity_source})"
    return f"Out of memory in {where}, {asked} with {fmt_bytes(oom.live_bytes)} held by tensors{against}."


def _where_lines(oom: OutOfMemory) -> list[str]:
    lines = []
    if oom.op:
        lines.append(f"The operation that asked: {oom.op}")
    if oom.where:
        lines.append(f"Last line of your code on the way: {oom.where}")
    if oom.reserved_bytes is not None:
        seg = "on" if oom.expandable_segments else "off"
        lines.append(
            f"The CUDA caching allocator had reserved {fmt_bytes(oom.reserved_bytes)}, "
            f"{fmt_bytes(oom.fragmentation_bytes)} of it unallocated (fragmentation); "
            f"expandable_segments is {seg}"
            + (
                " — PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets that memory be reused."
                if not oom.expandable_segments and (oom.fragmentation_bytes or 0) > (oom.requested_bytes or 0)
                else "."
            )
        )
    return lines


def _categories_table(oom: OutOfMemory) -> str:
    rows = "".join(
        f"<tr><th>{escape(c.replace('_', ' '))}</th><td>{escape(fmt_bytes(oom.categories.get(c)))}</td></tr>"
        for c in MEMORY_CATEGORIES
    )
    return f"<table class='kv'><tr><th>live at the failure</th><th>bytes</th></tr>{rows}</table>"


def _tensors_table(oom: OutOfMemory) -> str:
    if not oom.top_tensors:
        return ""
    head = "<tr><th>bytes</th><th>shape</th><th>dtype</th><th>category</th><th>name</th><th>made by</th></tr>"
    rows = "".join(
        "<tr>"
        f"<td>{escape(fmt_bytes(t.get('bytes')))}</td>"
        f"<td class='text'>{escape(str(list(t.get('shape') or [])))}</td>"
        f"<td class='text'>{escape(str(t.get('dtype', '')))}</td>"
        f"<td class='text'>{escape(str(t.get('category', '')).replace('_', ' '))}</td>"
        f"<td class='text'>{escape(str(t.get('name') or '–'))}</td>"
        f"<td class='text'>{escape(str(t.get('made_by') or '–'))}</td>"
        "</tr>"
        for t in oom.top_tensors
    )
    return f"<p>The largest live tensors:</p><table>{head}{rows}</table>"


def fix_sentences(d: Diagnosis) -> list[str]:
    """The fixes as sentences, those that fit first."""
    out = []
    for f in d.fixes:
        verdict = "fits" if f.fits else "does not fit"
        out.append(
            f"{f.change}: the step would need ≈ {fmt_bytes(f.need_bytes)}, which {verdict} ({f.formula})."
        )
    return out


def _fixes_html(d: Diagnosis) -> str:
    room = f" in the {fmt_bytes(d.room_bytes)} tensors can use" if d.room_bytes is not None else ""
    intro = f"<p>The failed step needs ≈ {escape(fmt_bytes(d.need_bytes))}{escape(room)}. What would make it fit:</p>"
    items = "".join(f"<li>{escape(s)}</li>" for s in fix_sentences(d))
    line = d.compare_line
    trial = (
        f"<p>Measure them: put <code>{escape(line)}</code> on top of the training cell.</p>" if line else ""
    )
    return f"{intro}<ul>{items}</ul>{trial}<p class='formula'>{escape(d.formula)}</p>"


def oom_html(run: Run) -> str | None:
    """The section's body for a run that ran out of memory; None for any other run."""
    oom = run.oom
    if oom is None:
        return None
    d = diagnose(oom, run.context.get("optimizer"))
    parts = [f"<div class='finding critical'><p><strong>{escape(headline(oom))}</strong></p>"]
    parts += [f"<p>{escape(line)}</p>" for line in _where_lines(oom)]
    parts.append("</div>")
    parts.append(_categories_table(oom))
    parts.append(_fixes_html(d))
    parts.append(_tensors_table(oom))
    return "".join(parts)


def oom_text(run: Run) -> str | None:
    """The same for a terminal (``swift-nb show``)."""
    oom = run.oom
    if oom is None:
        return None
    d = diagnose(oom, run.context.get("optimizer"))
    lines = [headline(oom), *_where_lines(oom), "Live at the failure:"]
    lines += [f"  {c.replace('_', ' ')}: {fmt_bytes(oom.categories.get(c))}" for c in MEMORY_CATEGORIES]
    lines.append(f"The failed step needs ≈ {fmt_bytes(d.need_bytes)}. What would make it fit:")
    lines += [f"  - {s}" for s in fix_sentences(d)]
    if d.compare_line:
        lines.append(f"Measure them: {d.compare_line}")
    return "\n".join(lines)
