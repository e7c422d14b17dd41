"""The Python API's top: capture a run, then analyse it and write its report.

Everything here composes the layers below (capture → record → analysis → render); the
notebook magic and the CLI call these same functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swift_nb.analysis import Analysis, analyze
from swift_nb.analysis.trace import TABLES_FILE, parse_events, save_tables
from swift_nb.capture.session import Session, interval_seconds
from swift_nb.capture.torch_profiler import ProfilerConfig
from swift_nb.record import Run, load_run, save
from swift_nb.render.report import Section, analysis_fields, document_html, report_sections, write_report


@dataclass
class Reported:
    """A saved run with its analyses (None when they failed) and the report's sections
    (figures rendered once, for report.html and the notebook alike)."""

    run: Run
    analysis: Analysis | None
    sections: list[Section]


def report(run: Run | Path | str, trace_events: list[dict] | None = None) -> Reported:
    """Analyse a saved run and write its ``report.html``. A failing analysis is noted in
    the run instead of raised: what was measured is never lost to it. ``trace_events``:
    the trace's events when the caller holds them already (saves reading the file)."""
    run = run if isinstance(run, Run) else load_run(run)
    try:
        trace = None
        if trace_events is not None and run.trace_path is not None:
            trace = parse_events(trace_events)
            save_tables(trace, run.trace_path.with_name(TABLES_FILE))
        analysis = analyze(run, trace=trace)
    except Exception as e:  # a bug in an analysis must not cost the user the run
        run.notes.append(f"analysis failed ({type(e).__name__}: {e}); the run's data is intact")
        analysis = None
    sections = report_sections(run, **analysis_fields(analysis))
    write_report(run, document_html(run, sections))
    save(run)
    return Reported(run, analysis, sections)


def finish(session: Session, status: str = "ok", error: BaseException | None = None) -> Reported:
    """Stop a session, save its record, then analyse it and write the report."""
    run = session.finish(status, error)
    return report(run, session.take_trace_events())


def status_of(exc_type: type[BaseException] | None) -> str:
    if exc_type is None:
        return "ok"
    return "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed"


class profile:  # noqa: N801 - used like a function: `with swift_nb.profile() as run:`
    """Profile the enclosed code; ``as run`` gives the Run record, complete after the block
    (its folder then also holds ``report.html``; ``self.analysis`` the analyses).

    wait/warmup/active/repeat: the profiler schedule, in steps (a step ends at each
    ``optimizer.step()`` or ``swift_nb.step()``). record_shapes, profile_memory,
    with_stack: torch.profiler options. interval_ms: resource sampling period.
    count_flops: count one step's FLOPs (that step runs slower; its trace is discarded).
    label: a name for the run. out_dir: root folder of run folders (default
    ``$SWIFT_NB_DIR`` or ``./swift_nb_runs``). keep: runs to retain there (default 20).
    context: facts to store with the run (e.g. ``{"seq_len": 2048}``).
    """

    def __init__(
        self,
        wait: int = 1,
        warmup: int = 2,
        active: int = 3,
        repeat: int = 1,
        record_shapes: bool = True,
        profile_memory: bool = True,
        with_stack: bool = False,
        interval_ms: float = 100,
        count_flops: bool = False,
        label: str | None = None,
        out_dir: Path | str | None = None,
        keep: int | None = None,
        context: dict[str, Any] | None = None,
        source: dict[str, Any] | None = None,
    ) -> None:
        cfg = ProfilerConfig(wait, warmup, active, repeat, record_shapes, profile_memory, with_stack)
        self.session = Session(
            profiler=cfg,
            interval_s=interval_seconds(interval_ms),
            label=label,
            out_dir=out_dir,
            keep=keep,
            context=context,
            source=source,
            count_flops=count_flops,
        )
        self.analysis: Analysis | None = None

    @property
    def run(self) -> Run:
        return self.session.run

    def __enter__(self) -> Run:
        return self.session.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.analysis = finish(self.session, status_of(exc_type), exc).analysis
        return False
