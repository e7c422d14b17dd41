"""The live panel of a ``%%swift_profile`` cell: progress, rate, ETA, the profiler's phase
and sparklines of utilisation and memory, while the cell's code runs.

A background thread reads the session's step counter and the sampler's newest row every
``TICK_S`` and sends only the widgets whose displayed value changed, in one message per
widget (``hold_sync``). So however fast the steps come, the frontend receives at most
``MAX_MESSAGES_PER_TICK`` update messages per tick — the bar and the text every tick, the
charts at most every ``CHART_PERIOD_S`` — plus ``FINAL_MESSAGES`` when the run stops:
``message_bound(T)`` for a panel that ran T seconds.

The widgets only display: every number here is also in the run record and the static
outputs shown after the cell. A step-time alert (``swift_nb.capture.resources.alerts``) shows as a line
under the numbers, as soon as the journal's thread raised it.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from html import escape
from typing import Any

import ipywidgets as widgets
from IPython.display import display

from swift_nb.core.units import fmt_bytes, fmt_pct
from swift_nb.record import Run

TICK_S = 0.25  # at most 4 updates a second, whatever the step rate
SAVING_TICK_S = 1.0  # while the run is saved and analysed: its seconds, once a second
CHART_PERIOD_S = 1.0  # the charts' SVG is the largest message: redrawn at most once a second
RATE_WINDOW_S = 3.0  # steps/s over the last few seconds, not since the start
MAX_POINTS = 240  # chart history; halved (every second point kept) when full
MAX_MESSAGES_PER_TICK = 3  # bar, text, charts
FINAL_MESSAGES = 2 * MAX_MESSAGES_PER_TICK  # "saving…" when the cell ends, then the final state

BAR_STYLE = {"ok": "success", "interrupted": "warning", "failed": "danger"}
PHASE_TEXT = {"wait": "wait", "warmup": "warmup", "active": "active (recording)", "none": "done"}

STYLE = """<style>
.swift-nb-live-stats { font-size: 13px; line-height: 28px; padding-left: 1em; }
.swift-nb-live-stats span { margin-right: 1.2em; white-space: nowrap; }
.swift-nb-live-charts { display: flex; gap: 2em; flex-wrap: wrap; }
.swift-nb-live-charts .chart { font-size: 12px; color: #555; }
</style>"""


def message_bound(seconds: float) -> int:
    """The most widget update messages a live panel that ran ``seconds`` may send."""
    ticks = math.floor(seconds / TICK_S) + 1
    charts = math.floor(seconds / CHART_PERIOD_S) + 1
    return (MAX_MESSAGES_PER_TICK - 1) * ticks + charts + FINAL_MESSAGES


def fmt_duration(s: float | None) -> str:
    """Whole seconds (``42 s``, ``3 min 05 s``, ``1 h 02 min``): the text changes at most
    once a second while nothing else does."""
    if s is None or not math.isfinite(s):
        return "–"
    s = max(0, round(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def fmt_steps_rate(rate: float | None) -> str:
    if rate is None or not math.isfinite(rate) or rate <= 0:
        return "–"
    return f"{rate:.3g} steps/s"


def sparkline(values: Sequence[float], label: str, current: str, y_max: float) -> str:
    """An inline SVG line chart of ``values`` (NaN skipped) from 0 to ``y_max``."""
    width, height = 240, 40
    pts = [(i, v) for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    line = ""
    if len(pts) >= 2 and y_max > 0:
        n = max(len(values) - 1, 1)
        coords = " ".join(
            f"{i * width / n:.1f},{height - min(v, y_max) * (height - 2) / y_max - 1:.1f}" for i, v in pts
        )
        line = f"<polyline fill='none' stroke='#4c72b0' stroke-width='1.5' points='{coords}'/>"
    return (
        f"<div class='chart'><div>{escape(label)}: <b>{escape(current)}</b></div>"
        f"<svg width='{width}' height='{height}' viewBox='0 0 {width} {height}' role='img' "
        f"aria-label='{escape(label)}'><rect width='{width}' height='{height}' fill='#f4f6fa'/>{line}</svg></div>"
    )


class History:
    """A bounded series for a sparkline: when full, every second point is dropped, so the
    chart always spans the whole run."""

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self.values: list[float] = []
        self._max = max_points

    def add(self, value: float) -> None:
        self.values.append(value)
        if len(self.values) >= self._max:
            self.values = self.values[::2]

    def extend(self, values) -> None:
        for v in values:
            self.add(float(v))


def _first_present(row: dict[str, Any], names: Sequence[str]) -> str | None:
    for name in names:
        v = row.get(name)
        if isinstance(v, (int, float)) and math.isfinite(v):
            return name
    return None


def _series(row: dict[str, Any]) -> tuple[tuple[str, str] | None, tuple[str, str] | None]:
    """(column, label) of utilisation and of memory in a sample row: the first GPU's
    utilisation and CUDA allocated bytes when present, else process CPU % and RSS."""
    util = _first_present(row, ["gpu0_util_pct", "cpu_pct"])
    mem = _first_present(row, ["cuda0_allocated_bytes", "rss_bytes"])
    util_label = {"gpu0_util_pct": "GPU util", "cpu_pct": "process CPU"}
    mem_label = {"cuda0_allocated_bytes": "CUDA allocated", "rss_bytes": "RSS"}
    return (
        (util, util_label[util]) if util else None,
        (mem, mem_label[mem]) if mem else None,
    )


class LivePanel:
    """The widgets and the thread that updates them. ``show()`` and ``start()`` right
    after the session started, ``stop()`` as soon as the cell's code returned (or raised),
    ``close(run)`` once the run is saved.

    The session is read, never driven: its step counter and its sampler's newest row,
    read without locks (an int, and the last item of a list, are read atomically)."""

    def __init__(self, session: Any, total_steps: int | None = None) -> None:
        self._session = session
        self._cfg = getattr(session, "profiler_cfg", None)
        self._total = total_steps
        self.bar = widgets.IntProgress(
            value=0, min=0, max=self._bar_max(0), layout=widgets.Layout(width="320px")
        )
        self.text = widgets.HTML()
        self.charts = widgets.HTML()
        self.box = widgets.VBox(
            [widgets.HTML(STYLE), widgets.HBox([self.bar, self.text]), self.charts],
            layout=widgets.Layout(padding="4px 0"),
            _dom_classes=["swift-nb-live"],
        )
        self._util = History()
        self._sm = History()  # GPM's SM activity beside the utilisation, where the GPU counts it
        self._mem = History()
        self._series: tuple[tuple[str, str] | None, tuple[str, str] | None] = (None, None)
        self._last_sample_t: float | None = None
        self._last_chart = -math.inf
        self._chart_dirty = False
        self._rates: deque[tuple[float, int]] = deque()
        self._t0 = time.perf_counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._saved = threading.Event()
        self._saving: threading.Thread | None = None
        self._saving_since: float | None = None
        self._frozen: list[str] = []

    # -- lifecycle -----------------------------------------------------------------------

    def show(self) -> None:
        """Display the panel: the widget view, with a text fallback for viewers without
        the widget manager (the same numbers are in the static outputs after the cell)."""
        self._t0 = time.perf_counter()
        self._update(self._t0)
        bundle = self.box._repr_mimebundle_()
        bundle["text/plain"] = (
            "swift_nb live panel (needs a running kernel; the results follow as static outputs)"
        )
        display(bundle, raw=True)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="swift_nb-live", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and show that the run is being saved and analysed, with the
        seconds since (a large trace takes a while to digest) until ``close``. Safe to call
        twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self._saving_since = time.perf_counter()
            self._update(self._saving_since, saving=True)
            self._saving = threading.Thread(target=self._saving_loop, name="swift_nb-saving", daemon=True)
            self._saving.start()

    def _saving_loop(self) -> None:
        """The phase's line while the run is saved and analysed: its seconds, and the
        trace's events once they are counted, every ``SAVING_TICK_S``; nothing else changes."""
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while not self._saved.wait(SAVING_TICK_S):
            try:
                self._send(self.text, value=self._stats_html([*self._frozen, self._saving_html()]))
            except Exception:  # a display problem must never touch the run
                return

    def _saving_html(self) -> str:
        elapsed = time.perf_counter() - (self._saving_since or time.perf_counter())
        events = (getattr(getattr(self._session, "run", None), "summary", None) or {}).get("trace_events")
        text = "saving and analyzing…"
        if elapsed >= SAVING_TICK_S:
            text += f" {fmt_duration(elapsed)}"
        if isinstance(events, int) and events > 0:
            text += f" (the trace's {events:,} events)"
        return f"<span class='swift-nb-saving'>profiler: {escape(text)}</span>"

    def end_saving(self) -> None:
        """Stop the saving line's ticks (``close`` does, with the final state)."""
        self._saved.set()
        if self._saving is not None:
            self._saving.join()
            self._saving = None

    def close(self, run: Run) -> None:
        """The final state, from the saved record: its steps, its whole sample series, its
        status (the bar green when ok, orange when interrupted, red when failed)."""
        self.stop()
        self.end_saving()
        steps = int(run.summary.get("steps") or 0)
        samples = run.samples
        if samples is not None and not samples.empty:
            self._series = _series(samples.iloc[-1].to_dict())
            self._util, self._sm, self._mem = History(), History(), History()
            util, mem = self._series
            if util:
                self._util.extend(samples[util[0]])
                if _sm_column(util[0]) in samples:
                    self._sm.extend(samples[_sm_column(util[0])].dropna())
            if mem:
                self._mem.extend(samples[mem[0]])
        total = self._total if self._total and steps < self._total else steps
        stats = [
            f"<span><b>{escape(run.status)}</b></span>",
            self._step_html(steps, total),
            f"<span>{escape(fmt_steps_rate(run.summary.get('steps_per_s')))}</span>",
            f"<span>wall {escape(fmt_duration(run.wall_s))}</span>",
            "<span>profiler: done</span>",
        ]
        alerts = run.summary.get("alerts") or []
        if alerts:
            stats.append(_alert_html(str(alerts[-1].get("message", "")), len(alerts)))
        self._send(self.bar, value=steps, max=max(total, 1), bar_style=BAR_STYLE.get(run.status, ""))
        self._send(self.text, value=self._stats_html(stats))
        self._send(self.charts, value=self._charts_html())

    # -- the update thread ---------------------------------------------------------------

    def _loop(self) -> None:
        # Lowest priority for this thread only, as the sampler's: a redraw waits for a gap
        # in the training's threads instead of preempting one.
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while not self._stop.wait(TICK_S):
            try:
                self._update(time.perf_counter())
            except Exception:  # a display problem must never touch the run
                return

    def _update(self, now: float, saving: bool = False) -> None:
        step = self._session.steps_done
        self._read_sample()
        rate = self._rate(now, step)
        total = self._total
        stats = [
            self._step_html(step, total),
            f"<span>{escape(fmt_steps_rate(rate))}</span>",
            f"<span>elapsed {escape(fmt_duration(now - self._t0))}</span>",
        ]
        if total:
            eta = (total - step) / rate if rate and step < total else None
            stats.append(f"<span>ETA {escape(fmt_duration(eta))}</span>")
        if saving:
            self._frozen = list(stats)  # the numbers as the cell ended, while the saving ticks
            stats.append(self._saving_html())
        else:
            stats.append(f"<span>profiler: {escape(self._phase_text(step))}</span>")
        alerts = getattr(self._session, "alerts", None)
        if alerts:
            stats.append(_alert_html(alerts[-1].message, len(alerts)))
        self._send(self.bar, value=min(step, self._bar_max(step)), max=self._bar_max(step))
        self._send(self.text, value=self._stats_html(stats))
        if self._chart_dirty and (saving or now - self._last_chart >= CHART_PERIOD_S):
            self._send(self.charts, value=self._charts_html())
            self._last_chart = now
            self._chart_dirty = False

    @staticmethod
    def _send(widget: widgets.Widget, **state: Any) -> None:
        """Set the traits whose value changed (none if nothing did). A bound (``max``,
        ``min``) goes first, in a message of its own: the front end clamps a value to the
        bounds it holds when the value arrives, and a message carrying both may be applied
        value first (JupyterLab showed 6 of 40 for a finished 40-step run whose bar still
        had the schedule's 6 as its maximum)."""
        changed = {k: v for k, v in state.items() if getattr(widget, k) != v}
        bounds = {k: changed.pop(k) for k in ("max", "min") if k in changed}
        for k, v in bounds.items():
            setattr(widget, k, v)
        if changed:
            with widget.hold_sync():
                for k, v in changed.items():
                    setattr(widget, k, v)

    def _read_sample(self) -> None:
        row = self._session.latest_sample()
        if not row:
            return
        if row.get("t_s") == self._last_sample_t:
            return
        self._last_sample_t = row.get("t_s")
        if None in self._series:  # e.g. CPU % has no value until its second reading
            found = _series(row)
            self._series = (self._series[0] or found[0], self._series[1] or found[1])
        util, mem = self._series
        if util:
            self._util.add(float(row.get(util[0], math.nan)))
            sm = row.get(_sm_column(util[0]))
            if isinstance(sm, (int, float)) and math.isfinite(sm):  # GPM reads once per window
                self._sm.add(float(sm))
        if mem:
            self._mem.add(float(row.get(mem[0], math.nan)))
        self._chart_dirty = True

    def _rate(self, now: float, step: int) -> float | None:
        """Steps per second over the last ``RATE_WINDOW_S`` (since the start at first)."""
        self._rates.append((now, step))
        while now - self._rates[0][0] > RATE_WINDOW_S:
            self._rates.popleft()
        t_then, step_then = self._rates[0]
        if now - t_then < 1.0:
            return step / (now - self._t0) if step and now > self._t0 else None
        return (step - step_then) / (now - t_then)

    # -- what is shown -------------------------------------------------------------------

    def _bar_max(self, step: int) -> int:
        """The bar's end: the ``--steps`` hint, else the profiler schedule's length (the
        bar then tracks the schedule and stays full once it is done; a repeating schedule
        fills it once per cycle)."""
        if self._total:
            return self._total
        cfg = self._cfg
        if cfg is None:
            return max(step, 1)
        return cfg.total_steps or cfg.cycle

    def _phase_text(self, step: int) -> str:
        cfg = self._cfg
        if cfg is None:
            return "off"
        phase = cfg.phase(step)
        text = PHASE_TEXT.get(phase, phase)
        if cfg.repeat == 0:
            text += f" (cycle {step // cfg.cycle + 1})"
        return text

    @staticmethod
    def _step_html(step: int, total: int | None) -> str:
        of_total = f" / {total}" if total else ""
        return (
            f"<span class='swift-nb-step' data-step='{step}' data-total='{total or ''}'>"
            f"step <b>{step}{of_total}</b></span>"
        )

    @staticmethod
    def _stats_html(stats: list[str]) -> str:
        return f"<div class='swift-nb-live-stats'>{''.join(stats)}</div>"

    def _charts_html(self) -> str:
        util, mem = self._series
        parts = []
        if util:
            values = self._util.values
            y_max = max([100.0, *(v for v in values if math.isfinite(v))])
            parts.append(sparkline(values, util[1], fmt_pct(_last(values)), y_max))
            if self._sm.values:  # the gap between the two is the message: busy is not full
                parts.append(sparkline(self._sm.values, "SMs active", fmt_pct(_last(self._sm.values)), 100.0))
        if mem:
            values = self._mem.values
            y_max = max((v for v in values if math.isfinite(v)), default=0.0)
            parts.append(sparkline(values, mem[1], fmt_bytes(_last(values)), y_max))
        return f"<div class='swift-nb-live-charts'>{''.join(parts)}</div>"


def _sm_column(util: str) -> str:
    """The SM-activity column of the device whose utilisation column is ``util``."""
    return util.replace("_util_pct", "_sm_active_pct")


def _alert_html(message: str, count: int) -> str:
    """The newest alert (``swift_nb.capture.resources.alerts``) on a line of its own, and how many so far."""
    more = f" ({count} alerts)" if count > 1 else ""
    return f"<div class='swift-nb-alert' style='color:#b35900'>⚠ {escape(message)}{escape(more)}</div>"


def _last(values: Sequence[float]) -> float | None:
    for v in reversed(values):
        if math.isfinite(v):
            return v
    return None
