"""One profiling session: step watcher + resource sampler + scheduled torch profiler,
producing a Run record on disk.

``profile()`` is the public entry point; ``Session`` is shared with ``ResourceMonitor``
and the notebook magic so that every front uses the same machinery.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import platform
import socket
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import torch
from torch.utils.flop_counter import FlopCounterMode

from swift_nb import trace_names
from swift_nb.capture import dist, job, oom, signals
from swift_nb.capture import memory_categories as memcat
from swift_nb.capture.journal import Journal
from swift_nb.capture.rss import RssReader
from swift_nb.capture.sampler import Sampler
from swift_nb.capture.stderr_filter import StderrFilter
from swift_nb.capture.steps import StepWatcher
from swift_nb.capture.torch_profiler import ProfilerConfig, TraceRecorder
from swift_nb.errors import ConfigError, RunDirError
from swift_nb.options import ProfileOptions
from swift_nb.record import (
    STEP_COLUMNS,
    TRACE_FILE,
    OutOfMemory,
    Run,
    default_keep,
    default_root,
    ensure_writable,
    new_run_id,
    prune,
    rank_folder,
    rank_trace_file,
    save,
    summarize,
    utc_now_iso,
)
from swift_nb.units import fmt_ranks


def rank_info() -> tuple[int, int]:
    """(rank, world size) of this process: torch.distributed if initialised, else
    torchrun's environment, else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def environment(ranks: dist.RankInfo | None = None) -> dict[str, Any]:
    rank, world = rank_info()
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "mem_total_bytes": psutil.virtual_memory().total,
        "rank": rank,
        "world_size": world,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
    }
    if torch.cuda.is_available():
        env["cuda"] = torch.version.cuda
        env["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    else:
        env["devices"] = [platform.processor() or platform.machine()]
    if ranks is not None:
        env.update(ranks.tags())
    return env


class Session:
    """Captures one run. ``start()``, then step boundaries arrive, then ``finish()``.

    options: what to capture and where (``ProfileOptions``; validated there).
    trace: run the scheduled torch profiler (False: resources and steps only).
    periodic_samples: sample every ``options.interval_ms`` in the background (False:
    at step boundaries only).
    sample_every: take a step-boundary sample every this many steps; ``sync_samples``
    takes it on the training thread at the boundary, instead of soon after on the sampler's.
    use_optimizer_hook: whether optimizer steps mark boundaries (False: explicit only).
    ``options.count_flops`` counts one step's FLOPs with torch's FlopCounterMode (that
    step runs slower: it is the last step before the first recorded one, whose trace is
    discarded anyway).
    """

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
        label, count_flops, gather_timeout_s = o.label, o.count_flops, o.gather_timeout_s
        now = datetime.now()
        self.run = Run(id=o.run_id or new_run_id(label, now), label=label)
        self.run.context = dict(context or {})
        self.run.source = {"argv": list(sys.argv), **(source or {})}
        self._watcher = StepWatcher(self._on_boundary, use_optimizer_hook)
        self._rows: list[tuple] = []
        self._step = 0
        self._step_start = 0.0
        self._hook_cost = 0.0  # seconds spent in our step hook, all steps
        self._hook_cost_now = 0.0  # ... at the boundary that began the current step
        self._snapshots: dict[int, memcat.Snapshot] = {}
        self._snapshot_failed = False
        # The trace's events once finished, so the analysis need not read the file again;
        # whoever analyses the run takes them (take_trace_events) and the memory goes.
        self.trace_events: list[dict] | None = None
        self.trace_tables: Any = None  # ... and its tables, when built while the cell ran
        self._sampler: Sampler | None = None
        self._trace: TraceRecorder | None = None
        self._stderr = StderrFilter()
        self._cuda = torch.cuda.is_available()
        self._t0 = 0.0
        self._finished = False
        self._rss = RssReader()
        self._flop_step = _flop_step(profiler) if count_flops else None
        self._flops: FlopCounterMode | None = None
        # One rank of a distributed job: see swift_nb.capture.dist and .job for the protocol.
        self._ranks = dist.RankInfo.detect()
        self._gather_timeout_s = gather_timeout_s if gather_timeout_s is not None else dist.gather_timeout_s()
        self._group: dist.RankGroup | None = None
        self._job_path: Path | None = None
        self._termination = signals.TerminationHandler(self._on_terminate)
        self._journal: Journal | None = None
        if o.run_id is not None and self._ranks is None and (self.root / o.run_id).exists():
            raise RunDirError(f"run folder {self.root / o.run_id} exists already: choose another run id")

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Run:
        self._watcher.install()  # refuses a nested profile before anything is written
        run = self.run
        try:
            if self._ranks is None:
                run.path = self.root / run.id
                run.path.mkdir(parents=True)
            else:
                self._join_job()
            run.status = "running"
            run.started_at = utc_now_iso()
            run.pid = os.getpid()
            run.host = socket.gethostname()
            run.environment = environment(self._ranks)
            if self.profiler_cfg is not None:
                c = self.profiler_cfg
                run.schedule = {k: getattr(c, k) for k in c.__dataclass_fields__}
            save(run)  # a crash from here on still leaves a readable `running` record
            if self._ranks is not None and self._ranks.rank == 0:
                save(Run(**{**run.__dict__, "path": None}), self._job_path)
            self._t0 = time.perf_counter()
            if self._cuda:
                torch.cuda.reset_peak_memory_stats()
            rank = run.environment["rank"]
            self._sampler = Sampler(self.interval_s, lambda: self._step, rank, self.monitor_gpu, self.note)
            self._sampler.start(self._t0)
            self._journal = Journal(run, self._rows, self._sampler.drain)
            self._journal.start()
            self._termination.install()
            if self.profiler_cfg is not None:
                self._stderr.start()
                if self._ranks is None:
                    self._trace = TraceRecorder(self.profiler_cfg, run.path, self.note)
                else:
                    name = rank_trace_file(self._ranks.rank)
                    self._trace = TraceRecorder(self.profiler_cfg, self._job_path, self.note, name)
                # the analysis reads a rank's trace from its file (trace.rank<R>.tables.npz)
                self._trace.build_tables = self.options.report and self._ranks is None
                self._trace.start()
                self._snapshot_if_recorded()
            self._count_flops_if_due()
        except BaseException:
            self.finish("failed")
            raise
        return run

    def _join_job(self) -> None:
        """Agree on the job folder with the other ranks and make this rank's part of it."""
        info, run = self._ranks, self.run
        job_id = None
        if info.initialized:
            self._group, reason = dist.RankGroup.open(info, self._gather_timeout_s)
            if reason:
                self.note(reason)
            if self._group is not None:
                job_id = self._group.agree(run.id)
        if job_id is None:
            job_id = dist.fallback_job_id(run.label)
        run.id = job_id
        self._job_path = self.root / job_id
        run.path = rank_folder(self._job_path, info.rank)
        run.path.mkdir(parents=True, exist_ok=True)

    def take_trace_events(self) -> list[dict] | None:
        events, self.trace_events = self.trace_events, None
        return events

    def take_trace_tables(self) -> Any:
        """The trace's tables (``swift_nb.analysis.trace.Trace``) when they were built
        while the cell ran, else None; like the events, they go to whoever takes them."""
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

    def note(self, msg: str) -> None:
        if msg not in self.run.notes:
            self.run.notes.append(msg)

    def finish(self, status: str = "ok", error: BaseException | None = None) -> Run:
        """Stop everything, write the record and return it. Each part is stopped even if
        another fails, and a second Ctrl-C waits until the record is saved, so nothing
        already measured is lost."""
        if self._finished:
            return self.run
        self._finished = True
        try:
            with signals.deferred():
                return self._finish(status, error)
        finally:
            self._termination.restore()

    def _on_terminate(self, signum: int) -> None:
        """SIGTERM/SIGHUP: save the run in full as ``terminated``; the signal then takes
        its usual course (see ``signals``)."""
        self.note(
            f"terminated by {signals.name(signum)}: the run was saved, then the signal took its usual course"
        )
        self.finish("terminated")

    def _finish(self, status: str, error: BaseException | None) -> Run:
        run = self.run
        end_s = time.perf_counter() - self._t0
        if status == "failed" and oom.is_oom(error):
            status = "oom"
            self._post_mortem(error)
        if error is not None:
            self.note(f"{status}: {type(error).__name__}: {error}".rstrip(": "))
            run.summary["traceback"] = job.describe_error(error)
        trace = self._stop_capture()
        if run.path is None:  # start() failed before the folder existed
            run.status = status
            return run
        if not self._rows:
            self._rows.append(self._row(0, 0.0, end_s, "end", 0.0))
            self.note(
                "no step boundary was seen (no optimizer.step() and no swift_nb.step()); "
                "the cell is recorded as one span"
            )
        steps = pd.DataFrame(self._rows, columns=STEP_COLUMNS)
        if trace is not None and trace.path is not None:
            run.files["trace"] = TRACE_FILE if self._ranks is None else f"../{trace.path.name}"
            run.summary["trace_events"] = len(trace.events)
            self.trace_events = trace.events
            self.trace_tables = trace.tables
            run.summary["recorded_steps"] = trace.recorded_steps
            self._add_memory_categories(run, steps, trace)
        elif self.profiler_cfg is not None:
            self.note("the profiler recorded no step: the cell ended before the schedule's active steps")
        run.steps = steps
        run.samples = pd.DataFrame(self._sampler.rows() if self._sampler else [])
        run.status = status
        run.wall_s = end_s
        run.summary.update(summarize(run.steps, run.samples))
        run.summary["profiler_overhead_s"] = self._hook_cost
        self._detect_context()
        if self._ranks is not None:
            self._rank_summary(run, trace)
        self._watcher.optimizers.clear()  # do not keep the user's optimizers alive
        save(run)
        if self._ranks is not None:
            run = self._gather(run)
            if self._ranks.rank != 0:
                return run
        try:
            prune(self.root, self.keep, spare=run.path)
        except OSError as e:
            self.note(f"old runs could not be pruned ({e})")
        return run

    def _post_mortem(self, error: BaseException) -> None:
        """Read what was in memory at the failure while its traceback still holds it."""
        try:
            found = oom.post_mortem(error, step=self._step, optimizers=self._watcher.optimizers.values())
            self.run.oom = OutOfMemory.from_dict(found)
        except Exception as e:  # never raised over the user's own error
            self.note(f"what was in memory at the failure could not be read ({type(e).__name__}: {e})")

    def _stop_capture(self):
        """Stop every part of the capture (each even if another fails); the finished
        trace, or None."""
        self._watcher.remove()
        if self._journal is not None:
            self._journal.stop()
            if self._journal.failed:
                self.note(f"the run could not be saved while it ran ({self._journal.failed})")
            self.run.summary["journal_flushes"] = self._journal.flushes
            self.run.summary["journal_s"] = self._journal.flush_s
        if self._flops is not None:  # the run ended inside the counted step: no full count
            self._flops.__exit__(None, None, None)
            self._flops = None
        trace = None
        if self._trace is not None:
            try:
                self._trace.stop()
                trace = self._trace.finish()
            except Exception as e:
                self.note(f"the profiler trace could not be written ({type(e).__name__}: {e})")
        self._stderr.stop()
        if self._sampler is not None:
            self._sampler.stop()
        self._rss.close()  # later reads (the run's last row) go through psutil
        return trace

    def _rank_summary(self, run: Run, trace) -> None:
        events = trace.events if trace is not None else []
        # The analysis reads each rank's trace from its file (trace.rank<R>.tables.npz).
        self.trace_events = self.trace_tables = None
        collective_s, share = job.collective_summary(events)
        run.summary["collective_s_per_step"] = collective_s
        run.summary["collective_share"] = share
        run.context["layout"] = job.parallel_layout(events, self._watcher.optimizers.values(), self._ranks)

    def _gather(self, run: Run) -> Run:
        """Send this rank's part to rank 0; on rank 0, write and return the job record."""
        info, group = self._ranks, self._group
        notes: list[str] = []
        parts: dict[int, dict] = {}
        t0 = deadline = time.monotonic()
        if group is not None:
            gathered, reason = group.gather(job.payload(run, info))
            group.close()
            if reason:
                notes.append(reason)
            elif gathered is not None:
                parts = {p["row"]["rank"]: p for p in gathered if p is not None}
        else:
            deadline += self._gather_timeout_s  # nobody to talk to: wait for their files
        if info.rank != 0:
            if notes:
                self.note(notes[0])
                save(run)
            return run
        parts[0] = job.payload(run, info)
        parts[0]["row"]["source"] = "self"
        missing = [r for r in range(info.world_size) if r not in parts]
        if missing:
            found = job.collect_from_disk(self._job_path, missing, deadline)
            parts.update(found)
            if found:
                notes.append(f"merged the partial records of {fmt_ranks(sorted(found))} from the job folder")
        merged = job.build_job(run, self._job_path, parts, info.world_size, notes)
        merged.summary["gather_s"] = time.monotonic() - t0  # rank 0's wait and merge, before saving
        for f in dataclasses.fields(Run):  # the caller's Run object becomes the job record
            setattr(run, f.name, getattr(merged, f.name))
        save(run)
        return run

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
                    self._trace.digest(self._memory_job())
        else:
            self._bookkeeping(k, t_in, trigger)
        self._step_start = time.perf_counter() - self._t0
        self._hook_cost_now = self._step_start + self._t0 - t_in
        self._hook_cost += self._hook_cost_now
        self._termination.release()

    def _bookkeeping(self, k: int, t_in: float, trigger: str) -> None:
        self._rows.append(self._row(k, self._step_start, t_in - self._t0, trigger, self._hook_cost_now))
        if self._sampler is not None and (k + 1) % self.sample_every == 0:
            self._sampler.on_step(self.sync_samples)
        self._snapshot_if_recorded()
        if self._flop_step is not None:
            self._count_flops_if_due()

    def _row(self, k: int, start: float, end: float, trigger: str, overhead: float) -> tuple:
        peak = reserved = math.nan
        if self._cuda:
            peak = torch.cuda.max_memory_allocated()
            reserved = torch.cuda.memory_reserved()
            torch.cuda.reset_peak_memory_stats()
        phase = self.profiler_cfg.phase(k) if self.profiler_cfg else "none"
        return (k, start, end, end - start, phase, trigger, overhead, peak, reserved, self._rss())

    def _count_flops_if_due(self) -> None:
        k = self._step
        if self._flops is not None and k == self._flop_step + 1:
            self._flops.__exit__(None, None, None)
            self.run.summary["flops_per_step"] = int(self._flops.get_total_flops())
            self.run.summary["flops_step"] = self._flop_step
            self._flops = None
        elif k == self._flop_step:
            self._flops = FlopCounterMode(display=False)
            self._flops.__enter__()

    def _snapshot_if_recorded(self) -> None:
        """At both edges of every step the profiler records (with memory), note what the
        optimizers hold; the memory replay needs them. Costs O(parameters), so only there."""
        cfg = self.profiler_cfg
        if cfg is None or not cfg.profile_memory or self._snapshot_failed:
            return
        k = self._step
        if cfg.phase(k) == "active" or (k > 0 and cfg.phase(k - 1) == "active"):
            try:
                self._snapshots[k] = memcat.snapshot(self._watcher.optimizers.values())
            except RuntimeError as e:  # e.g. FSDP2's sharded parameters between steps
                self.note(f"memory by category is not available for these parameters ({e})")
                self._snapshot_failed = True

    def _memory_job(self):
        """The memory replay of a finished cycle's events with the snapshots taken so far
        (a function for the trace's background work), or None when there is none to do."""
        cfg = self.profiler_cfg
        if cfg is None or not cfg.profile_memory or self._snapshot_failed:
            return None
        snapshots = dict(self._snapshots)
        device = memcat.device_type_code(self._watcher.optimizers.values())
        return lambda events: memcat.step_memory(events, snapshots, device)

    def _add_memory_categories(self, run: Run, steps: pd.DataFrame, trace) -> None:
        """Per recorded step: category bytes at the step's peak (steps.csv) and the
        category timeline (memory.csv). On CPU the replay's peak is the step's peak
        tensor memory; on CUDA the allocator's own peak stays authoritative."""
        if self._snapshot_failed:
            return
        per_step = trace.memory
        if per_step is None:
            optimizers = self._watcher.optimizers.values()
            per_step = memcat.step_memory(trace.events, self._snapshots, memcat.device_type_code(optimizers))
        if not per_step:
            return
        for c in memcat.CATEGORIES:
            steps[f"{c}_bytes"] = steps["step"].map({k: m.at_peak[c] for k, m in per_step.items()})
        if not self._cuda:
            steps["peak_tensor_bytes"] = steps["step"].map({k: m.peak for k, m in per_step.items()})
        frames = []
        for k, m in per_step.items():
            tl = pd.DataFrame(m.timeline, columns=["ts_us", *(f"{c}_bytes" for c in memcat.CATEGORIES)])
            start_s = steps.loc[steps["step"] == k, "start_s"].iloc[0]
            # trace clock (µs) -> run clock (s): the profiler's span of step k begins where step k does
            tl.insert(0, "step", k)
            tl.insert(0, "t_s", start_s + (tl.pop("ts_us") - m.start_us) / 1e6)
            frames.append(tl)
        run.memory = pd.concat(frames, ignore_index=True)
        run.summary["memory_categories_at_peak"] = {
            c: float(pd.Series([m.at_peak[c] for m in per_step.values()]).median()) for c in memcat.CATEGORIES
        }

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
        for opt in self._watcher.optimizers.values():
            ctx.setdefault("optimizer", type(opt).__name__)
            params = [p for g in opt.param_groups for p in g["params"]]
            if params:
                ctx.setdefault("dtype", str(params[0].dtype).removeprefix("torch."))
                ctx.setdefault("params", sum(p.numel() for p in params))
            break


def _flop_step(cfg: ProfilerConfig | None) -> int:
    """Which step to count FLOPs in: the one just before the first recorded step (its
    profile is discarded anyway), else the first step after the recorded ones."""
    if cfg is None:
        return 1
    if cfg.wait + cfg.warmup >= 1:
        return cfg.wait + cfg.warmup - 1
    return cfg.active


def cell_source(cell: str) -> dict[str, Any]:
    """How a notebook cell is identified in the record: a hash, never its text."""
    return {"cell_sha1": hashlib.sha1(cell.encode("utf-8")).hexdigest(), "cell_lines": cell.count("\n") + 1}
