"""One profiling session: step watcher + resource sampler + scheduled torch profiler,
producing a Run record on disk.

``profile()`` is the public entry point; ``Session`` is shared with ``ResourceMonitor``
and the notebook magic so that every front uses the same machinery.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from swift_nb.capture import dist, finetune, job, signals
from swift_nb.capture import models as found_models
from swift_nb.capture.compile import CompileRecorder
from swift_nb.capture.digest import DigestResult
from swift_nb.capture.environment import environment
from swift_nb.capture.flops import StepFlops, flop_step
from swift_nb.capture.helper import Helper
from swift_nb.capture.job_rank import JobRank
from swift_nb.capture.journal import Journal, steps_table
from swift_nb.capture.memory import oom, stale_models
from swift_nb.capture.memory.modules import ModuleScopes
from swift_nb.capture.memory.snapshots import MemoryRecorder
from swift_nb.capture.resources.alerts import Alert, OnAlert, StepTimeWatch
from swift_nb.capture.resources.rss import RssReader
from swift_nb.capture.resources.sampler import Sampler
from swift_nb.capture.stderr_filter import StderrFilter
from swift_nb.capture.steps import StepWatcher
from swift_nb.capture.tokens import TokenCounter
from swift_nb.capture.torch_profiler import OnTrace, ProfilerConfig, TraceRecorder, TraceResult
from swift_nb.core import trace_names
from swift_nb.core.errors import ConfigError, RunDirError
from swift_nb.core.units import MIN_8BIT_SIZE
from swift_nb.record import (
    FINETUNE_KEY,
    TRACE_FILE,
    OutOfMemory,
    Run,
    default_keep,
    default_root,
    ensure_writable,
    new_run_id,
    prune,
    save,
    tabulate,
    utc_now_iso,
)
from swift_nb.vocabulary.options import ProfileOptions

#: how long a finished run's Summary waits for its trace's digest before it is shown
#: without it (``Session.stop``'s ``before_trace``)
PREVIEW_AFTER_S = 0.05
#: said in the preview ``Session.stop`` hands ``before_trace``
PREVIEW_NOTE = (
    "the trace is still being digested: the time breakdown, the operators, memory by "
    "category and the findings the trace shows follow with the report"
)
_RUNNING: list[Session] = []  # the session capturing in this process (one at a time: no nesting)


def running() -> Session | None:
    """The session capturing in this process now, between its start and its stop, or None."""
    return _RUNNING[0] if _RUNNING else None


class Session:
    """Captures one run. ``start()``, then step boundaries arrive, then ``stop()``.

    options: what to capture and where (``ProfileOptions``; validated there). trace: run the
    scheduled torch profiler (False: resources and steps only). periodic_samples: sample every
    ``options.interval_ms`` in the background (False: at step boundaries only). sample_every:
    take a step-boundary sample every this many steps; ``sync_samples`` takes it on the
    training thread at the boundary, instead of soon after on the sampler's.
    use_optimizer_hook: whether optimizer steps mark boundaries (False: explicit only).
    on_trace: what to do with the finished trace while the cell still runs (``OnTrace``; the
    layers above hand it in: the capture calls nothing of theirs otherwise); only for a
    one-cycle schedule, a single process and ``options.report``. What it returned is
    ``take_trace_tables()``'s. ``options.count_flops`` counts one step's FLOPs
    (``swift_nb.capture.flops``). on_alert: called with each alert (a step-time regression,
    ``capture.resources.alerts.Alert``) as it is raised, on the journal's thread; alerts are
    also in the run's notes and its summary's ``alerts``. ``running()``: the session between
    its start and its stop (``measure_link()`` saves a link in its run)."""

    def __init__(
        self,
        options: ProfileOptions | None = None,
        *,
        trace: bool = True,
        periodic_samples: bool = True,
        context: dict[str, Any] | None = None,
        source: dict[str, Any] | None = None,
        monitor_gpu: bool = True,
        sample_every: int = 1,
        sync_samples: bool = False,
        use_optimizer_hook: bool = True,
        on_trace: OnTrace | None = None,
        on_alert: OnAlert | None = None,
    ) -> None:
        o = self.options = options if options is not None else ProfileOptions()
        if not isinstance(sample_every, int) or sample_every < 1:
            raise ConfigError("interval", "must be a whole number of steps, at least 1", sample_every)
        self.root = ensure_writable(Path(o.out_dir) if o.out_dir is not None else default_root()).resolve()
        self.keep = o.keep if o.keep is not None else default_keep()
        profiler = ProfilerConfig.from_options(o) if trace else None
        self.profiler_cfg = profiler
        self.interval_s = o.interval_s if periodic_samples else None
        self.monitor_gpu = monitor_gpu
        self.sample_every = sample_every
        self.sync_samples = sync_samples
        self.on_trace = on_trace
        now = datetime.now()
        self.run = Run(id=o.run_id or new_run_id(o.label, now), label=o.label)
        self.run.context = dict(context or {})
        self.run.source = {"argv": list(sys.argv), **(source or {})}
        self._watcher = StepWatcher(self._on_boundary, use_optimizer_hook)
        self._rows: list[tuple] = []
        self._step = 0
        self._step_start = 0.0
        self._hook_cost = 0.0  # seconds spent in our step hook, all steps
        self._hook_cost_now = 0.0  # ... at the boundary that began the current step
        # which of the models found the run uses, and which are only alive (capture.memory.stale_models)
        self._use = stale_models.ModelUse()
        self._split: tuple[dict[str, torch.nn.Module], dict[str, torch.nn.Module]] = ({}, {})
        self._split_at = -1  # the step the split was made at
        self._memory = MemoryRecorder(
            profiler,
            self._watcher.optimizers.values(),
            self.note,
            lambda: self._models_split()[0].values(),
            stale=lambda: self._models_split()[1].values(),
        )
        self._compile = CompileRecorder()  # torch.compile's work per step: swift_nb.capture.compile
        self._tokens = TokenCounter()  # tokens per step: swift_nb.capture.tokens
        self._modules = ModuleScopes(self.note)  # the recorded steps by module: capture.memory.modules
        self.trace_tables: Any = None  # what on_trace's build made of the trace (take_trace_tables)
        self._helper: Helper | None = None  # digests the trace off this process (capture.helper)
        self._trace_lost = False  # the trace was recorded, then could not be written
        self.digested: DigestResult | None = None  # ... and what it found, once the run ends
        self._sampler: Sampler | None = None
        self._trace: TraceRecorder | None = None
        self._stderr = StderrFilter()
        self._cuda = torch.cuda.is_available()
        self._t0 = 0.0
        self._finished = False
        self._rss = RssReader()
        self._flops = StepFlops(flop_step(profiler)) if o.count_flops else None
        # One rank of a distributed job: see swift_nb.capture.job_rank.
        ranks = dist.RankInfo.detect()
        timeout_s = o.gather_timeout_s if o.gather_timeout_s is not None else dist.gather_timeout_s()
        self._job = JobRank(ranks, self.root, timeout_s, self.note) if ranks is not None else None
        self._termination = signals.TerminationHandler(self._on_terminate)
        self._watch = StepTimeWatch()  # read on the journal's thread (watch_steps)
        self._watched = 0  # step rows the watch has seen
        self._watch_lock = threading.Lock()
        self.on_alert = on_alert
        self._journal: Journal | None = None
        if o.run_id is not None and self._job is None and (self.root / o.run_id).exists():
            raise RunDirError(f"run folder {self.root / o.run_id} exists already: choose another run id")

    # -- lifecycle -----------------------------------------------------------------------

    def start(self, namespace: Mapping[str, Any] | None = None) -> Run:
        """Begin capturing. ``namespace``: where the cell's objects live when the caller is
        not the cell's own frame (a notebook's user namespace), so its models' tokens are
        counted from the first step."""
        self._watcher.install()  # refuses a nested profile before anything is written
        run = self.run
        try:
            if self._job is None:
                run.path = self.root / run.id
                run.path.mkdir(parents=True)
            else:
                self._job.join(run)
            run.status = "running"
            run.started_at = utc_now_iso()
            run.pid = os.getpid()
            run.host = socket.gethostname()
            run.environment = environment(self._job.info if self._job is not None else None)
            if self.profiler_cfg is not None:
                c = self.profiler_cfg
                run.schedule = {k: getattr(c, k) for k in c.__dataclass_fields__}
            save(run)  # a crash from here on still leaves a readable `running` record
            if self._job is not None:
                self._job.started(run)
            self._compile.install()
            models = found_models.on_stack(sys._getframe(1))
            self._use.watch(models.values())
            if namespace is not None:
                models.update(found_models.in_namespace(namespace))
                self._use.watch(models.values())
            self._watch_tokens(models)
            self._t0 = time.perf_counter()
            if self._cuda:
                torch.cuda.reset_peak_memory_stats()
            rank = run.environment["rank"]
            self._sampler = Sampler(self.interval_s, lambda: self._step, rank, self.monitor_gpu, self.note)
            self._sampler.start(self._t0)
            self._journal = Journal(run, self._rows, self._sampler.drain, on_flush=self.watch_steps)
            self._journal.start()
            self._termination.install()
            if self.profiler_cfg is not None:
                # started first: its interpreter starts while the first steps run
                self._helper = Helper(run.path, self.note)
                self._helper.start(figures=self.options.report)
                self._stderr.start()
                self._trace = self._new_trace(self.profiler_cfg, self._helper)
                self._trace.start()
                self._memory.at_boundary(self._step)
                self._modules.at_boundary(self.profiler_cfg.phase(0) == "active", lambda: models)
            if self._flops is not None:
                self._flops.at_boundary(self._step, run.summary)
        except BaseException:
            self.stop("failed")
            raise
        _RUNNING[:] = [self]
        return run

    def _new_trace(self, cfg: ProfilerConfig, helper: Helper) -> TraceRecorder:
        run = self.run
        if self._job is None:
            build = self.on_trace.build if self.on_trace is not None and self.options.report else None
            return TraceRecorder(cfg, run.path, self.note, helper=helper, build=build)
        # A rank's trace goes beside the others'; the analysis reads it from its file
        # (trace.rank<R>.tables.npz), so nothing is handed on.
        return TraceRecorder(cfg, self._job.path, self.note, self._job.trace_file, helper=helper, rank=True)

    @property
    def helper_pid(self) -> int | None:
        """The process digesting this run's trace (None: none running)."""
        return self._helper.pid if self._helper is not None and self._helper.alive else None

    def take_trace_tables(self) -> Any:
        """What ``on_trace``'s build returned for the finished trace (for ``swift_nb.api``),
        else None; it goes to whoever takes it."""
        tables, self.trace_tables = self.trace_tables, None
        return tables

    @property
    def steps_done(self) -> int:
        """Steps completed so far (read from any thread)."""
        return self._step

    def latest_sample(self) -> dict[str, Any] | None:
        """The sampler's newest reading (None before the first or without a sampler)."""
        return self._sampler.latest() if self._sampler is not None else None

    def begin_step(self) -> None:
        """Mark the start of the current step (time before it belongs to no step)."""
        self._step_start = time.perf_counter() - self._t0

    def end_step(self, trigger: str = "explicit") -> None:
        self._on_boundary(trigger, None)

    @property
    def alerts(self) -> list[Alert]:
        """The alerts raised so far (read from any thread)."""
        return self._watch.alerts

    def watch_steps(self) -> None:
        """Give the step-time watch the steps booked since the last call; note each alert
        in the run and hand it to ``on_alert`` (on the caller's thread: the journal's
        while the run runs). A failing callback is noted, never raised."""
        with self._watch_lock:
            # the rows the journal dropped are before any row not yet watched
            base = self._journal.dropped if self._journal is not None else 0
            n = len(self._rows)
            new, self._watched = self._rows[self._watched - base : n], base + n
            raised = self._watch.feed(new)
        for alert in raised:
            self.note(alert.message)
            if self.on_alert is not None:
                try:
                    self.on_alert(alert)
                except Exception as e:
                    self.note(f"on_alert failed ({type(e).__name__}: {e}); the run goes on")

    def note(self, msg: str) -> None:
        if msg not in self.run.notes:
            self.run.notes.append(msg)

    def stop(
        self,
        status: str = "ok",
        error: BaseException | None = None,
        before_trace: Callable[[Run], None] | None = None,
    ) -> Run:
        """Stop everything, write the record and return it. Each part is stopped even if
        another fails, and a second Ctrl-C waits until the record is saved, so nothing
        already measured is lost. ``before_trace``: called with a preview of the record
        (a copy: its steps, samples and summary, no trace) when the run's trace is still
        being digested, before waiting for it (a notebook shows its Summary then); its
        failure is not the run's."""
        if self._finished:
            return self.run
        self._finished = True
        try:
            with signals.deferred():
                return self._finish(status, error, before_trace)
        finally:
            self._termination.restore()

    def _on_terminate(self, signum: int) -> None:
        """SIGTERM/SIGHUP: save the run in full as ``terminated``; the signal then takes
        its usual course (see ``signals``)."""
        self.note(
            f"terminated by {signals.name(signum)}: the run was saved, then the signal took its usual course"
        )
        self.stop("terminated")

    def _finish(
        self, status: str, error: BaseException | None, before_trace: Callable[[Run], None] | None
    ) -> Run:
        _RUNNING.clear()
        run = self.run
        end_s = time.perf_counter() - self._t0
        if status == "failed" and oom.is_oom(error):
            status = "oom"
            self._post_mortem(error)
        if error is not None:
            self.note(f"{status}: {type(error).__name__}: {error}".rstrip(": "))
            run.summary["traceback"] = job.describe_error(error)
        self._stop_capture()
        if run.path is None:  # start() failed before the folder existed
            self._take_trace()
            run.status = status
            return run
        steps = self._steps_table(end_s)
        self._tokens.add_to(self.run, steps, self.note)
        self.watch_steps()  # the steps after the journal's last flush
        if self.alerts:
            run.summary["alerts"] = [a.to_dict() for a in self.alerts]
        self._compile.add_to(run)
        self._detect_context()
        if before_trace is not None and self._digest_outlasts(PREVIEW_AFTER_S):
            preview = run.copy(note=PREVIEW_NOTE)
            tabulate(preview, steps.copy(), self._samples(), status, end_s)
            try:
                before_trace(preview)
            except Exception:  # shown again, in full, once the trace is in
                pass
        trace = self._take_trace()
        if trace is not None and trace.path is not None:
            self._add_trace(run, steps, trace)
        elif self.profiler_cfg is not None and not self._trace_lost:
            self.note("the profiler recorded no step: the cell ended before the schedule's active steps")
        tabulate(run, steps, self._samples(), status, end_s)
        run.summary["profiler_overhead_s"] = self._hook_cost
        if self._job is not None:
            # The analysis reads each rank's trace from its file (trace.rank<R>.tables.npz).
            self.trace_tables = None
            digested = trace.digested if trace is not None else None
            self._job.summarize(run, digested, self._watcher.optimizers.values())
        self._name_stale_models()
        self._watcher.optimizers.clear()  # do not keep the user's optimizers and models alive
        self._watcher.models.clear()
        self._split = ({}, {})
        save(run)
        if self._job is not None:
            run = self._job.gather(run)
            if self._job.info.rank != 0:
                return run
        try:
            prune(self.root, self.keep, spare=run.path)
        except OSError as e:
            self.note(f"old runs could not be pruned ({e})")
        return run

    def _steps_table(self, end_s: float) -> pd.DataFrame:
        """steps.csv's rows so far; a cell without any boundary is one span."""
        if not self._rows:
            self._rows.append(self._row(0, 0.0, end_s, "end", 0.0))
            self.note(
                "no step boundary was seen (no optimizer.step() and no swift_nb.step()); "
                "the cell is recorded as one span"
            )
        dropped = self._journal.dropped if self._journal is not None else 0
        return steps_table(self._rows, dropped, self.run.path, self.note)

    def _add_trace(self, run: Run, steps: pd.DataFrame, trace: TraceResult) -> None:
        """The finished trace into the record, with the memory by category it gives."""
        assert trace.path is not None
        run.files["trace"] = TRACE_FILE if self._job is None else f"../{trace.path.name}"
        run.summary["trace_events"] = trace.events
        self.digested = trace.digested
        self.trace_tables = trace.tables
        run.summary["recorded_steps"] = trace.recorded_steps
        self._memory.add_to(run, steps, trace, self._cuda)
        self._modules.add_to(run.context, self._watcher.optimizers.values())

    def _post_mortem(self, error: BaseException) -> None:
        """Read what was in memory at the failure while its traceback still holds it."""
        try:
            _, stale = stale_models.split(self._watcher.models, self._watcher.optimizers.values(), self._use)
            found = oom.post_mortem(
                error, step=self._step, optimizers=self._watcher.optimizers.values(), stale=stale.values()
            )
            self.run.oom = OutOfMemory.from_dict(found)
        except Exception as e:  # never raised over the user's own error
            self.note(f"what was in memory at the failure could not be read ({type(e).__name__}: {e})")

    def _samples(self) -> pd.DataFrame:
        return pd.DataFrame(self._sampler.rows() if self._sampler else [])

    def _digest_outlasts(self, seconds: float) -> bool:
        """Whether this run's trace (not a rank's of a job) is still being digested
        ``seconds`` from now."""
        live = self._trace is not None and self._job is None and not self._trace_lost
        return live and self._trace.outlasts(seconds, self._memory.replay_input())  # type: ignore[union-attr]

    def _stop_capture(self) -> None:
        """Stop every part of the capture (each even if another fails) but the trace's
        digest, which ``_take_trace`` waits for."""
        self._watcher.remove()
        self._use.stop()
        self._compile.remove()
        self._tokens.finish()  # its hooks off the models (the counts stay for add_to)
        self._modules.at_boundary(False, dict)
        self._memory.stop()
        if self._journal is not None:
            self._journal.stop()
            if self._journal.failed:
                self.note(f"the run could not be saved while it ran ({self._journal.failed})")
            self.run.summary["journal_flushes"] = self._journal.flushes
            self.run.summary["journal_s"] = self._journal.flush_s
        if self._flops is not None:
            self._flops.stop()
        if self._trace is not None:
            try:
                self._trace.stop()
            except Exception as e:
                self._trace_lost = True
                self.note(f"the profiler trace could not be written ({type(e).__name__}: {e})")

    def _take_trace(self) -> TraceResult | None:
        """The finished trace, once its digest is done (None: none, or it was lost)."""
        trace = None
        try:
            if self._trace is not None and not self._trace_lost:
                try:
                    trace = self._trace.finish(self._memory.replay_input())
                except Exception as e:
                    self._trace_lost = True
                    self.note(f"the profiler trace could not be written ({type(e).__name__}: {e})")
        finally:
            if self._helper is not None:  # no helper outlives its run
                self._helper.close()
            self._stderr.stop()
            if self._sampler is not None:
                self._sampler.stop()
            self._rss.close()  # later reads (the run's last row) go through psutil
        return trace

    # -- step boundaries (hot path: keep cheap) -------------------------------------------

    def _on_boundary(self, trigger: str, optimizer: torch.optim.Optimizer | None) -> None:
        t_in = time.perf_counter()
        self._termination.busy = True  # a SIGTERM now waits until the step is booked
        k = self._step
        self._step = k + 1
        if self._trace is not None and self._trace.recording:
            # The profiler's span of step k ends first, and our bookkeeping below is a named event of the
            # next step, so the trace's step spans match steps.csv's durations.
            self._trace.step()
            with torch.profiler.record_function(trace_names.OWN_PREFIX + "step_hook"):
                self._bookkeeping(k, t_in, trigger)
                if self._trace.undigested:  # a cycle just ended, its last snapshot taken
                    self._trace.digest(self._memory.replay_input())
        else:
            self._bookkeeping(k, t_in, trigger)
        self._step_start = time.perf_counter() - self._t0
        self._hook_cost_now = self._step_start + self._t0 - t_in
        self._hook_cost += self._hook_cost_now
        self._termination.release()

    def _bookkeeping(self, k: int, t_in: float, trigger: str) -> None:
        self._rows.append(self._row(k, self._step_start, t_in - self._t0, trigger, self._hook_cost_now))
        self._tokens.at_boundary(k)
        self._use.boundary()
        if k == 0:  # the models the first boundary found (built inside the cell)
            self._use.watch(
                stale_models.untrained(self._watcher.models, self._watcher.optimizers.values()).values()
            )
            self._watch_tokens(self._watcher.models)
            self._describe_finetune()
            self._describe_blocks()
            for opt in self._watcher.optimizers.values():  # as it steps: a toggle's undo restores the class
                self.run.context.setdefault("optimizer", type(opt).__name__)
                break
        if self._sampler is not None and (k + 1) % self.sample_every == 0:
            self._sampler.on_step(self.sync_samples)
        self._memory.at_boundary(self._step)
        if self._flops is not None:
            self._flops.at_boundary(self._step, self.run.summary)
        recorded = self.profiler_cfg is not None and self.profiler_cfg.phase(self._step) == "active"
        self._modules.at_boundary(recorded, lambda: self._models_split()[0], self._compile.compiled)

    def _models_split(self) -> tuple[dict[str, torch.nn.Module], dict[str, torch.nn.Module]]:
        """The models found as (used, only alive), as of this step (made once per step, and
        only when asked: it costs O(parameters))."""
        if self._split_at != self._step:
            self._split = stale_models.split(
                self._watcher.models, self._watcher.optimizers.values(), self._use
            )
            self._split_at = self._step
        return self._split

    def _describe_finetune(self) -> None:
        """``context["finetune"]`` of the models the run uses, read at the first boundary:
        toggles (lora) are applied now, and undone when the run ends."""
        try:
            found = finetune.describe(self._models_split()[0], self._watcher.optimizers.values())
        except Exception as e:  # an odd model must never break the training loop
            self.note(f"the fine-tuning could not be read ({type(e).__name__}: {e})")
            return
        if found:
            self.run.context.setdefault(FINETUNE_KEY, found)

    def _describe_blocks(self) -> None:
        """``context["repeated_blocks"]``: the repeated blocks of the models the run uses
        (count, class, path), which the advisor and the forecast take over a count of
        attention calls in the trace (an encoder layer may call attention more than once)."""
        try:
            found = found_models.block_count(self._models_split()[0])
        except Exception as e:  # an odd model must never break the training loop
            self.note(f"the model's repeated blocks could not be read ({type(e).__name__}: {e})")
            return
        if found:
            self.run.context.setdefault("repeated_blocks", found)

    def _name_stale_models(self) -> None:
        """The models only alive in the kernel, named in the run (``stale_models.name_in``)."""
        opts = self._watcher.optimizers.values()
        stale_models.name_in(self.run, self._watcher.models, opts, self._use, self.note)

    def _watch_tokens(self, models: dict[str, torch.nn.Module]) -> None:
        """Count the tokens the models receive from now on; the language models' vocabulary
        goes to the context (the logits' size: swift_nb.capture.memory)."""
        try:
            self._tokens.watch(models.values())
            head = self._memory.watch_heads(models.values())
            if head is not None and "vocab_size" not in self.run.context:
                self.run.context["vocab_size"], self.run.context["lm_hidden_size"] = head
            for m in models.values():  # a Hugging Face model's attention kernel
                attn = getattr(getattr(m, "config", None), "_attn_implementation", None)
                if isinstance(attn, str):
                    self.run.context.setdefault("attn_implementation", attn)
        except Exception as e:  # an odd model must never break the training loop
            self.note(f"tokens could not be counted ({type(e).__name__}: {e})")

    def _row(self, k: int, start: float, end: float, trigger: str, overhead: float) -> tuple:
        peak = reserved = math.nan
        if self._cuda:
            peak = torch.cuda.max_memory_allocated()
            reserved = torch.cuda.memory_reserved()
            torch.cuda.reset_peak_memory_stats()
        phase = self.profiler_cfg.phase(k) if self.profiler_cfg else "none"
        compile_s = self._compile.at_boundary()
        return (k, start, end, end - start, phase, trigger, overhead, peak, reserved, self._rss(), compile_s)

    def _detect_context(self) -> None:
        ctx = self.run.context
        ctx.setdefault("toggles", [])
        ctx.setdefault("world_size", self.run.environment.get("world_size", 1))
        if self.options.forecast:  # the report forecasts these (swift_nb.analysis.forecast)
            ctx["forecast"] = list(self.options.forecast)
        for key, value in self._watcher.context.items():  # the Trainer or Accelerator driving the loop
            ctx.setdefault(key, value)
        if self._watcher.skipped_updates:
            ctx["skipped_updates"] = self._watcher.skipped_updates
        if FINETUNE_KEY not in ctx:
            try:
                found = finetune.describe(self._models_split()[0], self._watcher.optimizers.values())
            except Exception as e:  # an odd model must not cost the run its record
                found = {}
                self.note(f"the fine-tuning could not be read ({type(e).__name__}: {e})")
            if found:
                ctx[FINETUNE_KEY] = found
        for opt in self._watcher.optimizers.values():
            ctx.setdefault("optimizer", type(opt).__name__)
            params = [p for g in opt.param_groups for p in g["params"]]
            if params:
                ctx.setdefault("dtype", str(params[0].dtype).removeprefix("torch."))
                ctx.setdefault("params", sum(p.numel() for p in params))
                ctx.setdefault("params_small", sum(p.numel() for p in params if p.numel() < MIN_8BIT_SIZE))
                ctx.setdefault("params_largest", max(p.numel() for p in params))
            break
