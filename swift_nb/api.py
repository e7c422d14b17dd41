"""The Python API's top: capture a run, then analyze it and write its report.

Everything here composes the layers below (capture → record → analysis → render); the
notebook magic and the CLI call these same functions.
"""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from os import PathLike
from pathlib import Path
from typing import Any

from swift_nb.analysis import Analysis
from swift_nb.analysis.cost import price
from swift_nb.capture.helper import Helper
from swift_nb.capture.resources.alerts import Alert
from swift_nb.capture.session import Session
from swift_nb.core.devices import DEFAULT_DEVICE, check_price, resolve_device
from swift_nb.core.errors import ConfigError, RecordWriteWarning, check_whole
from swift_nb.core.gc_pause import paused
from swift_nb.record import Run, save_meta
from swift_nb.render.document import build_ahead, draw_run_ahead, draw_run_and_timeline_ahead
from swift_nb.render.figure_cache import FigureCache
from swift_nb.render.sections import Section

# the reading half of the API, torch-free, named here too: the magic, the monitor and the
# reruns compose it with capture
from swift_nb.reporting import Reported, compare, findings_of, report  # noqa: F401
from swift_nb.reporting import preview as preview_record
from swift_nb.toggles import Toggle, ToggleReport, build
from swift_nb.vocabulary.options import ProfileOptions

#: the options ``profile`` takes as keywords: every field of ``ProfileOptions``
OPTION_NAMES = frozenset(f.name for f in fields(ProfileOptions))

#: what the helper draws of a finished run (``_draw_elsewhere``)
DRAW_RUN_AHEAD = f"{draw_run_ahead.__module__}:{draw_run_ahead.__name__}"
DRAW_RUN_AND_TIMELINE_AHEAD = (
    f"{draw_run_and_timeline_ahead.__module__}:{draw_run_and_timeline_ahead.__name__}"
)


class ReportAhead:
    """The ``on_trace`` this layer hands its Session: ``build_ahead`` runs on the
    finished trace in the helper process, and the figures it drew join ``figures``, this
    run's cache, which its report takes (``finish``)."""

    build = f"{build_ahead.__module__}:{build_ahead.__name__}"  # imported by the helper: no torch

    def __init__(self) -> None:
        self.figures = FigureCache()

    def take(self, built: Any) -> None:
        """What ``build_ahead`` returned (None: it failed or did not run)."""
        if isinstance(built, FigureCache):
            for key in built:
                self.figures.put(key, built.png(key))


def finish(
    session: Session,
    status: str = "ok",
    error: BaseException | None = None,
    on_analysed: Callable[[Run, list[Section]], None] | None = None,
    timeline_png: bool = False,
) -> Reported:
    """Stop a session, save its record, then (its options' ``report``) analyze it and
    write the report; without, the record is complete and ``swift-nb report`` analyses it
    later. A session made with a ``ReportAhead`` hands its figures to the report.

    Never raises its own failure to write (a full disk, the folder removed while the cell
    ran) into the user's code after the training has run: that is said once, as a
    ``RecordWriteWarning``, with the run's notes; what was written stays readable and the
    Run in memory is complete. ``on_analysed``: as ``report`` takes it; where the trace is
    still being digested when the session stops, it is first called with a preview of the
    record analysed without its trace (``reporting.preview``). ``timeline_png``:
    the trace's timeline will be shown as a PNG (a notebook's static outputs); the helper
    draws it with the other figures."""
    o = session.options
    early = None
    if on_analysed is not None and o.report:

        def early(preview: Run) -> None:  # the Summary while the trace is digested
            with paused():
                preview_record(preview, on_analysed, o.price_per_hour, o.price_per_kwh)

    try:
        run = session.stop(status, error, before_trace=early)
    except OSError as e:
        return Reported(_write_failed(session.run, e), None, [])
    built = session.take_trace_tables()
    # The collector is paused while the run is analysed: its passes over the whole heap
    # (the training's objects, a notebook's) took 0.2 s of a later run's 0.5 s here.
    try:
        with paused():
            if not o.report:
                price(run, o.price_per_hour, o.price_per_kwh)
                save_meta(run)
                reported = Reported(run, None, [])
            elif not isinstance(ahead := session.on_trace, ReportAhead):
                reported = report(
                    run,
                    price_per_hour=o.price_per_hour,
                    price_per_kwh=o.price_per_kwh,
                    on_analysed=on_analysed,
                )
            else:
                ahead.take(built)
                reported = report(
                    run,
                    figures=ahead.figures,
                    drawing=_draw_elsewhere(run, timeline_png),
                    price_per_hour=o.price_per_hour,
                    price_per_kwh=o.price_per_kwh,
                    on_analysed=on_analysed,
                )
    except OSError as e:
        return Reported(_write_failed(run, e), None, [])
    log_to(reported.run, o.log_to)
    return reported


def log_to(run: Run, trackers: Sequence[str]) -> None:
    """Send a finished run to each tracker of ``trackers`` (``swift_nb.export``). A
    tracker that fails is said in the run's notes and as a ``RecordWriteWarning``, never
    raised: the training it measured is over and its record is saved."""
    from swift_nb.trackers import export

    for spec in trackers:
        try:
            where = export(run, to=spec)
        except Exception as e:
            said = f"the run could not be sent to {spec} ({type(e).__name__}: {e}); swift-nb export RUN --to … sends it later"
            run.notes.append(said)
            warnings.warn_explicit(said, RecordWriteWarning, "swift_nb", 0)
        else:
            run.notes.append(f"sent to {spec.partition(':')[0]}: {where}")
    if trackers and run.path is not None:
        try:
            save_meta(run)
        except OSError:  # the notes stay in the returned run
            pass


def _draw_elsewhere(run: Run, timeline_png: bool = False) -> Callable[[], Any] | None:
    """The figures the record alone determines (with ``timeline_png``, the trace's timeline
    too), given to this process's helper to draw while the analysis runs here (None: no
    helper is running; they are drawn here)."""
    if run.path is None:
        return None
    helper = Helper(Path(run.path), lambda said: None)  # failing, they are drawn here: nothing lost
    helper.start(launch=False)
    if not helper.alive:
        return None
    pending = helper.submit(DRAW_RUN_AND_TIMELINE_AHEAD if timeline_png else DRAW_RUN_AHEAD, replace(run))

    def drawn() -> Any:
        try:
            return pending.result()
        finally:
            helper.close()

    return drawn


def _write_failed(run: Run, error: OSError) -> Run:
    where = f" in {run.path}" if run.path is not None else ""
    said = (
        f"swift_nb could not write the run's record{where} ({type(error).__name__}: {error}); "
        "the training was not affected, what was written before stays readable, and the "
        "measurements are in the returned run"
    )
    if said not in run.notes:
        run.notes.append(said)
        # said as swift_nb's, not as a line of its code: the user reads it under their cell
        warnings.warn_explicit(said, RecordWriteWarning, "swift_nb", 0)
    return run


def apply_toggles(session: Session, toggles: Sequence[Toggle], namespace: Mapping[str, Any]) -> None:
    """Apply ``toggles`` to the objects in ``namespace`` (and those built while the run
    lasts) and record which ones in the run's context. Nothing stays applied on failure."""
    done: list[Toggle] = []
    try:
        for t in toggles:
            t.apply(namespace)
            done.append(t)
    except BaseException:
        for t in reversed(done):
            t.undo()
        raise
    session.run.context["toggles"] = [{"toggle": t.id, "params": dict(t.values)} for t in toggles]


def undo_toggles(session: Session, toggles: Sequence[Toggle]) -> list[ToggleReport]:
    """Undo ``toggles`` (newest first) and put their final reports in the run's context.
    A failing undo is noted in the run, never raised: the run is saved regardless."""
    reports: list[ToggleReport] = []
    for t in reversed(toggles):
        try:
            report = t.undo()
        except Exception as e:
            session.note(f"undoing {t.id} failed ({type(e).__name__}: {e}); restart the kernel to be safe")
            continue
        if report is not None:
            reports.insert(0, report)
    if toggles:
        session.run.context["toggles"] = [r.to_dict() for r in reports]
    return reports


def exit_status(exc_type: type[BaseException] | None) -> str:
    """The status of a run whose block ended raising ``exc_type`` (None: it ended normally)."""
    if exc_type is None:
        return "ok"
    return "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed"


class _Default:
    """A keyword of ``profile`` left out: the option keeps its value in ``options`` (or
    ``ProfileOptions``'s default)."""

    def __repr__(self) -> str:
        return "<default>"


#: the value of an option keyword that was not given
DEFAULT: Any = _Default()


class profile:  # noqa: N801 - used like a function: `with swift_nb.profile() as run:`
    """Profile the enclosed code; ``as run`` gives the Run record, complete after the block
    (its folder then also holds ``report.html``; ``self.analysis`` the analyses).

    Every option is a keyword below (the notebook magic's flags are the same options,
    ``ProfileOptions``); a keyword left out keeps its value from ``options``, else its default.

    Args:
        options: a ``ProfileOptions`` to start from (keywords override it).
        wait: steps skipped before profiling (default 1). A step ends at each
            ``optimizer.step()`` or ``swift_nb.step()``.
        warmup: steps traced then discarded (default 2).
        active: steps recorded per profiling cycle (default 3).
        repeat: profiling cycles; 0 cycles until the block ends (default 1).
        record_shapes: record operators' input shapes (default True).
        profile_memory: record tensor allocations, for memory by category (default True).
        with_stack: record Python stacks (slower; default False).
        count_flops: count one step's FLOPs for FLOP/s and MFU (that step runs slower).
        interval_ms: resource sampling period in ms (default 100).
        label: a name for the run.
        out_dir: the folder of run folders (default ``$SWIFT_NB_DIR`` or ``./swift_nb_runs``).
        keep: runs kept in that folder (default ``$SWIFT_NB_KEEP`` or 20).
        run_id: the run folder's name (default: from the time and the label).
        report: analyze the run and write ``report.html`` when it ends (default True).
        gather_timeout_s: in a torchrun job, the longest rank 0 waits for the other ranks, in
            seconds (default ``$SWIFT_NB_GATHER_TIMEOUT_S`` or 25).
        price_per_hour: USD per device-hour, for the summary's money keys (``cost_usd``,
            ``cost_per_1k_steps_usd``, ``idle_cost_per_1k_steps_usd``: ``swift_nb.analysis.cost``).
        price_per_kwh: USD per kWh, for ``energy_cost_usd``.
        log_to: trackers the finished run is sent to (``"mlflow"``, ``"wandb"``,
            ``"tensorboard"``, with arguments as ``"tensorboard:log_dir=runs"``: ``swift_nb.export``).
        forecast: "will it fit?" configurations for the report, e.g.
            ``"H100-80GB batch=32 seq=4096 dtype=bf16 toggles=grad_checkpointing"``.
        context: facts to store with the run (e.g. ``{"seq_len": 2048}``).
        source: where the profiled code came from (the magic gives the cell).
        toggles: optimizations applied for the block and undone after it: ids
            (``"flash_attention"``, ``"galore:rank=64"``), ``{id: params}`` or toggle objects;
            they act on the models and optimizers in ``namespace`` (default: the caller's
            variables) and on those constructed inside the block. Their reports go to
            ``run.context["toggles"]``.
        namespace: where toggles look for models and optimizers.
        on_alert: called with each ``swift_nb.Alert`` while the block runs (a step-time
            regression: steps 25 % slower than before, for half of 50 steps), on a thread of
            swift_nb's own; alerts are also in ``run.notes`` and ``run.summary["alerts"]``.

    Raises:
        ConfigError: an option out of range, before anything runs.
    """

    def __init__(
        self,
        options: ProfileOptions | None = None,
        *,
        wait: int = DEFAULT,
        warmup: int = DEFAULT,
        active: int = DEFAULT,
        repeat: int = DEFAULT,
        record_shapes: bool = DEFAULT,
        profile_memory: bool = DEFAULT,
        with_stack: bool = DEFAULT,
        count_flops: bool = DEFAULT,
        interval_ms: float = DEFAULT,
        label: str | None = DEFAULT,
        out_dir: str | PathLike[str] | None = DEFAULT,
        keep: int | None = DEFAULT,
        run_id: str | None = DEFAULT,
        report: bool = DEFAULT,
        gather_timeout_s: float | None = DEFAULT,
        price_per_hour: float | None = DEFAULT,
        price_per_kwh: float | None = DEFAULT,
        log_to: tuple[str, ...] = DEFAULT,
        forecast: tuple[str, ...] = DEFAULT,
        context: dict[str, Any] | None = None,
        source: dict[str, Any] | None = None,
        toggles: Sequence[Toggle | str] | Mapping[str, Mapping[str, Any]] | None = None,
        namespace: Mapping[str, Any] | None = None,
        on_alert: Callable[[Alert], None] | None = None,
    ) -> None:
        given = {k: v for k, v in locals().items() if k in OPTION_NAMES and v is not DEFAULT}
        self.options = (
            (options or ProfileOptions()).replace(**given) if given else (options or ProfileOptions())
        )
        self.toggles = build(toggles)
        self.namespace = namespace
        self.session = Session(
            self.options, context=context, source=source, on_trace=ReportAhead(), on_alert=on_alert
        )
        self.analysis: Analysis | None = None

    @property
    def run(self) -> Run:
        return self.session.run

    def __enter__(self) -> Run:
        if self.toggles:
            frame = sys._getframe(1)
            namespace = (
                self.namespace if self.namespace is not None else {**frame.f_globals, **frame.f_locals}
            )
            apply_toggles(self.session, self.toggles, namespace)
        try:
            return self.session.start()
        except BaseException:
            undo_toggles(self.session, self.toggles)
            raise

    def __exit__(self, exc_type, exc, tb) -> None:
        undo_toggles(self.session, self.toggles)
        self.analysis = finish(self.session, exit_status(exc_type), exc).analysis


def forecast(
    run: Run | None = None,
    device: str | float = DEFAULT_DEVICE,
    batch_size: int | None = None,
    seq_len: int | None = None,
    dtype: str | None = None,
    toggles: str | Sequence[str] | Mapping[str, Mapping[str, Any]] = (),
    world_size: int | None = None,
    calibration: Run | None = None,
    optimizer: str | None = None,
    steps: int | None = None,
    price_per_hour: float | None = None,
    *,
    model: Any = None,
    progress: bool = True,
) -> Any:
    """Will it fit? The peak tensor memory of a training step, by category, on ``device``:
    of ``run``'s model as measured (``swift_nb.analysis.forecast.forecast``, every argument
    as there), or of ``model``, a model that need not fit here: a preset's name
    (``"llama-3-8b"``, ``swift_nb.core.model_presets.PRESETS``), a transformers config, or a
    callable that builds an ``nn.Module``, run one step on fake tensors (nothing allocated;
    ``swift_nb.capture.fake_step``) at ``batch_size`` (default 1) × ``seq_len`` (default
    2048) in ``dtype`` (default bf16) with ``optimizer`` (default AdamW). With ``model``,
    ``run`` is a measured proxy of the same family whose allocator workspaces are carried
    over, and whose step time, scaled by FLOPs, gives the target's on the proxy's card; without
    it the forecast says it is uncalibrated and gives no step time.

    Args:
        run: a profiled run (its model forecast), or with ``model`` a proxy run.
        device: a preset, a number of bytes, ``"80GB"`` or ``"24GiB"``.
        batch_size: samples per rank.
        seq_len: tokens per sample.
        dtype: the parameters' dtype.
        toggles: as ``swift_nb.analysis.forecast.forecast`` takes them.
        world_size: the ranks the step is spread over.
        calibration: a second run of the same model (not with ``model``).
        optimizer: a class name.
        steps: price that many steps (with ``model``, a proxy run's step scaled by FLOPs).
        price_per_hour: USD per device-hour.
        model: the model to forecast from its config (see above).
        progress: a progress line on stderr while the fake step runs.

    Returns:
        A ``Forecast``.

    Raises:
        ConfigError: a bad argument (before any work: ``check_target``); a model that cannot
            be built or stepped on fake tensors, naming why.
    """
    from swift_nb.analysis.forecast import forecast as forecast_run

    check_target(
        run=run,
        calibration=calibration,
        device=device,
        batch_size=batch_size,
        seq_len=seq_len,
        world_size=world_size,
        steps=steps,
        dtype=dtype,
        toggles=toggles,
        price_per_hour=price_per_hour,
        progress=progress,
    )
    shape = (batch_size, seq_len, dtype, toggles, world_size)
    if model is None:
        if run is None:
            raise ConfigError(
                "run", "give a profiled run, or model= (a preset's name, a config or a callable)", None
            )
        check_target(optimizer=optimizer)
        return forecast_run(run, device, *shape, calibration, optimizer, steps, price_per_hour)
    if calibration is not None:
        raise ConfigError("model", "calibration= needs a measured run of the model itself", model)
    from swift_nb.model_forecast import forecast_model

    return forecast_model(model, run, device, *shape, optimizer, steps, price_per_hour, progress)


def plan(
    run: Run | None = None,
    device: str | None = None,
    memory_bytes: float | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    toggles_allowed: str | Sequence[str] | None = None,
    *,
    model: Any = None,
    max_toggles: int = 3,
    progress: bool = True,
) -> Any:
    """What would make it fit? Every combination of the toggles that change a step's memory
    (``swift_nb.analysis.forecast.plan``), forecast for ``device`` (a preset) or a budget of
    ``memory_bytes``, at ``batch_size`` × ``seq_len`` (the run's own by default).

    Args:
        run: a profiled run; with ``model``, a measured proxy (as ``forecast`` takes it).
        device: a preset of ``swift_nb.core.devices.DEVICES``: its capacity and its CUDA
            capability (which toggles can run there).
        memory_bytes: a budget in bytes (overrides the preset's capacity).
        batch_size: samples per rank.
        seq_len: tokens per sample.
        toggles_allowed: the toggles to combine, ids or one ``"a,b"`` string (default: every
            one that applies).
        model: a model forecast from its config (a preset's name, a transformers config or
            a callable), its step run once on fake tensors at the target batch and sequence.
        max_toggles: how many toggles at once.
        progress: a progress line on stderr while a fake step runs.

    Returns:
        A DataFrame, one row per combination: ``toggles``, ``predicted_peak_bytes``,
        ``fits``, ``headroom_bytes``, ``step_factor`` (of the run's step, estimated),
        ``predicted_step_s``, ``changes_training``, ``expected_error_pct``, ``why``; the
        rows that fit first, fastest first.

    Raises:
        ConfigError: neither a device nor ``memory_bytes``; a bad argument (before any work:
            ``check_target``).
    """
    from swift_nb.analysis.forecast import Measured, measure
    from swift_nb.analysis.forecast.plan import budget
    from swift_nb.analysis.forecast.plan import plan as plan_measured

    check_target(
        run=run,
        batch_size=batch_size,
        seq_len=seq_len,
        toggles_allowed=toggles_allowed,
        max_toggles=max_toggles,
        progress=progress,
    )
    budget(device, memory_bytes)
    if model is None:
        if run is None:
            raise ConfigError(
                "run", "give a profiled run, or model= (a preset's name, a config or a callable)", None
            )
        measured = run if isinstance(run, Measured) else measure(run)
    else:
        measured = _fake_measured(model, run, batch_size, seq_len, progress)
    return plan_measured(measured, device, memory_bytes, batch_size, seq_len, toggles_allowed, max_toggles)


def check_target(**given: Any) -> dict[str, Any]:
    """The arguments of ``forecast``, ``plan`` and the magic's ``--plan``, by their names,
    checked before any work starts and returned as the work takes them (a count as an int,
    ``device`` as a ``Device``, ``dtype`` by its full name, ``toggles`` with their parameters).
    A ``ConfigError`` names the first bad one and what to pass. ``None`` is the run's own (or
    the default) where the entry point takes it; ``0`` is an error, never "the run's own"."""
    checks = _checks()
    return {name: checks[name](name, value) for name, value in given.items()}


def _optional(check: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    return lambda name, value: None if value is None else check(name, value)


def _a_run(name: str, value: Any) -> Any:
    from swift_nb.analysis.forecast import Measured

    if not isinstance(value, (Run, Measured)):
        raise ConfigError(name, "must be a Run: swift_nb.load_run(folder) reads one from its folder", value)
    return value


def _toggles(name: str, value: Any) -> dict[str, dict[str, Any]]:
    from swift_nb import vocabulary
    from swift_nb.vocabulary.forecast_spec import parse_toggles

    wanted = parse_toggles(value)
    clash = vocabulary.clashes(wanted)
    if clash is not None:
        raise ConfigError(name, f"must be toggles that can run together: {clash}", value)
    return wanted


def _optimizer(name: str, value: Any) -> str:
    from swift_nb.analysis.effects import OPTIMIZERS

    if value not in OPTIMIZERS:
        raise ConfigError(name, f"must be one of {', '.join(OPTIMIZERS)}", value)
    return str(value)


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(name, "must be True or False", value)
    return value


@functools.cache
def _checks() -> dict[str, Callable[[str, Any], Any]]:
    """How each argument of ``check_target`` is checked, by its name (imported when first
    needed: the forecast's modules are not the profiler's)."""
    from swift_nb.analysis.forecast.plan import allowed_toggles
    from swift_nb.vocabulary.forecast_spec import dtype_name

    count = _optional(check_whole)
    return {
        "run": _optional(_a_run),
        "calibration": _optional(_a_run),
        "device": lambda name, value: resolve_device(value),
        "batch_size": count,
        "seq_len": count,
        "world_size": count,
        "steps": count,
        "max_toggles": lambda name, value: check_whole(name, value, 1, 5),
        "dtype": _optional(lambda name, value: dtype_name(value)),
        "optimizer": _optional(_optimizer),
        "toggles": _toggles,
        "toggles_allowed": lambda name, value: allowed_toggles(value),
        "price_per_hour": check_price,
        "progress": _bool,
    }


def _fake_measured(
    model: Any, proxy: Run | None, batch_size: int | None, seq_len: int | None, progress: bool
) -> Any:
    """``model``'s step on fake tensors at the target shape (bf16, AdamW), read as a run: the
    plans' toggles are priced by formula on it."""
    from swift_nb.model_forecast import measured_model

    return measured_model(model, proxy, batch_size or 1, seq_len or 2048, "bfloat16", "AdamW", (), progress)
