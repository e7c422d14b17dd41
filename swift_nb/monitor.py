"""``ResourceMonitor``: explicit step hooks and a text report, for training loops that
want resource tracking without the profiler. Same machinery as ``profile()``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swift_nb.api import exit_status, finish
from swift_nb.capture.resources.alerts import Alert
from swift_nb.capture.session import Session
from swift_nb.record import Run
from swift_nb.render.tables import summary_text
from swift_nb.vocabulary.options import ProfileOptions


@dataclass
class Report:
    """What ``generate_report()`` returns: the saved Run and a readable summary."""

    run: Run

    @property
    def summary(self) -> str:
        return summary_text(self.run)

    @property
    def path(self) -> Path | None:
        return self.run.path

    def __str__(self) -> str:
        return self.summary


class ResourceMonitor:
    """Sample utilisation and memory every ``interval`` steps.

    Hours of training keep memory bounded: steps stream to steps.csv every second, samples
    are decimated (at most 20 000), alerts keep 250 step times (``benchmarks/monitoring.py``).

    Args:
        interval: take a sample at every ``interval``-th ``step_end``, right there (10–50 is
            typical; a sample costs well under a millisecond; default 10).
        log_dir: root folder of run folders (default ``$SWIFT_NB_DIR`` or ``./swift_nb_runs``).
        monitor_gpu: read NVML and the CUDA allocator when a GPU is present (default True).
        monitor_memory: also sample every ``interval_ms`` in the background (memory spikes
            between steps); False samples at step ends only (default True).
        interval_ms: the background sampling period in ms (default 1000).
        label: a name for the run.
        context: facts to store with the run (``run.context``).
        on_alert: called with each ``swift_nb.capture.resources.alerts.Alert`` (a step-time
            regression) while the loop runs.
        price_per_hour: USD per device-hour, for the cost (``swift_nb.analysis.cost``).
        price_per_kwh: USD per kWh, for the cost.
        log_to: trackers the report is sent to (``swift_nb.export``).
    """

    def __init__(
        self,
        interval: int = 10,
        log_dir: str | Path | None = None,
        monitor_gpu: bool = True,
        monitor_memory: bool = True,
        interval_ms: float = 1000.0,
        label: str | None = None,
        context: dict[str, Any] | None = None,
        on_alert: Callable[[Alert], None] | None = None,
        price_per_hour: float | None = None,
        price_per_kwh: float | None = None,
        log_to: Sequence[str] = (),
    ) -> None:
        self._session = Session(
            ProfileOptions(
                interval_ms=interval_ms,
                label=label,
                out_dir=log_dir,
                price_per_hour=price_per_hour,
                price_per_kwh=price_per_kwh,
                log_to=tuple(log_to),
            ),
            on_alert=on_alert,
            trace=False,
            periodic_samples=monitor_memory,
            context=context,
            monitor_gpu=monitor_gpu,
            sample_every=interval,
            sync_samples=True,
            use_optimizer_hook=False,
        )
        self._report: Report | None = None

    @property
    def run(self) -> Run:
        return self._session.run

    def step_begin(self, step: int | None = None) -> None:
        """Mark the start of a step (starts monitoring on the first call)."""
        if self._report is not None:
            raise RuntimeError("this ResourceMonitor already produced its report; create a new one")
        if self._session.run.path is None:
            self._session.start()
        self._session.begin_step()

    def step_end(self, step: int | None = None) -> None:
        """Mark the end of a step."""
        if self._session.run.path is None:
            self.step_begin(step)
        self._session.end_step("explicit")

    def generate_report(self, status: str = "ok") -> Report:
        """Stop monitoring, save the run record and return the report (idempotent)."""
        if self._report is None:
            if self._session.run.path is None:
                self._session.start()
            self._report = Report(finish(self._session, status).run)
        return self._report

    def __enter__(self) -> ResourceMonitor:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._report is None:
            self._report = Report(finish(self._session, exit_status(exc_type), exc).run)
