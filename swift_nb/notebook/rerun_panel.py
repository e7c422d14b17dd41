"""The results panel's "Try a fix" box: toggle checkboxes, Rerun, a "Try it" button per
finding that names a toggle, Cancel, progress, and the comparison when it is done.

A click arrives once the cell has ended (the kernel is idle), so the reruns run in a
background thread and the panel stays usable: Cancel ends the running worker (its whole
process group) and skips the remaining variants. The replayed code is the session as it
was when the profiled cell ran (cells executed later are not replayed). The comparison
appears in the panel and in ``compare.html``; for a comparison that is also a static
output of the notebook, use ``%%swift_profile --compare``.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

import ipywidgets as widgets

from swift_nb import vocabulary
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.render.comparison.page import compare_figures, compare_table_html
from swift_nb.rerun import Compared, RerunBusyError, Variant, compare_cell
from swift_nb.toggles import get
from swift_nb.vocabulary.options import ProfileOptions


def offered() -> list[str]:
    """The toggles offered as checkboxes: those a single-process rerun can apply."""
    return [e.id for e in vocabulary.TOGGLES.values() if e.runnable and e.processes is None]


def multi_process() -> vocabulary.Entry | None:
    """The toggle that reruns the cell on several worker processes (sequence
    parallelism), offered with its process count and its parameters' choices."""
    return next((e for e in vocabulary.TOGGLES.values() if e.runnable and e.processes), None)


class RerunCancelledError(Exception):
    """Raised from the progress callback to end the running worker."""


class RerunControls:
    """Widgets that launch reruns of one profiled cell and show their comparison."""

    def __init__(
        self,
        shell: Any,
        options: ProfileOptions,
        cell: str,
        cells: list[str],
        run_id: str,
        findings: Sequence[Finding],
        out_dir: Path | None = None,
    ) -> None:
        self.shell, self.options, self.cell, self.cells, self.run_id = shell, options, cell, cells, run_id
        self.out_dir = out_dir  # reruns are recorded beside the run they rerun
        words = vocabulary.TOGGLES
        self.boxes = {
            t: widgets.Checkbox(value=False, description=words[t].title, indent=False) for t in offered()
        }
        # a toggle that reruns the cell on several worker processes: its count and choices
        self.multi = multi_process()
        self.multi_box = widgets.Checkbox(
            value=False, description=self.multi.title if self.multi else "", indent=False
        )
        self.multi_params: dict[str, widgets.Dropdown] = {}
        if self.multi is not None:
            for p in self.multi.params:
                choices = p.choices
                if p.name == self.multi.processes:
                    choices = tuple(sorted(set(choices) | set(self.multi.process_choices)))
                if choices:
                    self.multi_params[p.name] = widgets.Dropdown(
                        options=list(choices),
                        value=p.default,
                        description=p.aliases[-1] if p.aliases else p.name,
                        layout={"width": "12em"},
                    )
        self.rerun = widgets.Button(description="Rerun and compare", button_style="primary", icon="play")
        self.cancel = widgets.Button(description="Cancel", icon="stop", disabled=True)
        self.status = widgets.HTML(
            "<span class='caption'>Tick toggles, then Rerun: a baseline and each toggle "
            "run in fresh worker processes; this kernel's objects are not touched.</span>"
        )
        self.result = widgets.HTML("")
        self.try_buttons = []
        tried: set[str] = set()
        for f in findings:
            for toggle_id in f.toggles:
                if toggle_id in self.boxes and toggle_id not in tried:
                    tried.add(toggle_id)
                    b = widgets.Button(
                        description=f"Try {words[toggle_id].title}", tooltip=f.title, icon="flask"
                    )
                    b.on_click(lambda _, t=toggle_id: self.start([Variant(t, [get(t)])]))
                    self.try_buttons.append(b)
        self.rerun.on_click(lambda _: self.start(self._ticked()))
        self.cancel.on_click(lambda _: self._cancelled.set())
        self._cancelled = threading.Event()
        self._thread: threading.Thread | None = None
        self.compared: Compared | None = None

    def widget(self) -> widgets.VBox:
        rows = [
            widgets.HTML("<h4>Try a fix</h4>"),
            widgets.HBox([*self.boxes.values(), *self._multi_widgets()]),
            widgets.HBox([self.rerun, self.cancel, *self.try_buttons]),
            self.status,
            self.result,
        ]
        box = widgets.VBox(rows, _dom_classes=["swift-nb-rerun"])
        box.controls = self  # the forecast form's "Rerun the best plan" starts its reruns here
        return box

    def try_toggles(self, toggle_ids: list[str]) -> None:
        """Rerun the cell with ``toggle_ids`` together, as one variant beside the baseline."""
        self.start([Variant("+".join(toggle_ids), [get(t) for t in toggle_ids])])

    def _ticked(self) -> list[Variant]:
        variants = [Variant(t, [get(t)]) for t, box in self.boxes.items() if box.value]
        if self.multi is not None and self.multi_box.value:
            values = {name: w.value for name, w in self.multi_params.items()}
            params = ",".join(f"{k}={v}" for k, v in values.items())
            variants.append(Variant(f"{self.multi.id}({params})", [get(self.multi.id, **values)]))
        return variants

    def _multi_widgets(self) -> list[widgets.Widget]:
        return [self.multi_box, *self.multi_params.values()] if self.multi is not None else []

    def _buttons(self, running: bool) -> None:
        self.rerun.disabled = running
        for b in self.try_buttons:
            b.disabled = running
        for w in (*self.boxes.values(), *self._multi_widgets()):
            w.disabled = running
        self.cancel.disabled = not running

    def start(self, variants: list[Variant]) -> None:
        if not variants:
            self.status.value = "<span class='caption'>Tick at least one toggle first.</span>"
            return
        if self._thread is not None and self._thread.is_alive():
            self.status.value = "<span class='caption'>A rerun is already running; Cancel it first.</span>"
            return
        self._cancelled.clear()
        self._buttons(True)
        self.result.value = ""
        self._thread = threading.Thread(
            target=self._run, args=(variants,), name="swift_nb-rerun", daemon=True
        )
        self._thread.start()

    def _progress(self, name: str, p: dict[str, Any]) -> None:
        if self._cancelled.is_set():
            raise RerunCancelledError
        phase = p.get("phase", "starting")
        where = (
            f"replaying cell {p.get('cell', 0)}/{p.get('cells', '?')}"
            if phase == "replay"
            else f"profiling, {p.get('steps', 0)} steps"
            if phase == "profile"
            else phase
        )
        self.status.value = f"<span class='caption'>Rerun <b>{escape(name)}</b>: {escape(where)}…</span>"

    def _run(self, variants: list[Variant]) -> None:
        try:
            self.compared = compare_cell(
                self.shell,
                self.options,
                self.cell,
                variants,
                cells=self.cells,
                rerun_of=self.run_id,
                out_dir=self.out_dir,
                on_progress=self._progress,
            )
            statuses = ", ".join(f"{o.variant}: {o.status}" for o in self.compared.outcomes)
            self.status.value = f"<span class='caption'>Done — {escape(statuses)}.</span>"
            self.result.value = comparison_html(self.compared)
        except RerunCancelledError:
            self.status.value = "<span class='caption'>Cancelled: the running worker was ended.</span>"
        except RerunBusyError as e:
            self.status.value = f"<span class='caption'>{escape(str(e))}</span>"
        except Exception as e:  # shown in the panel; a thread's exception would vanish
            self.status.value = (
                f"<span class='caption'>The rerun failed: {escape(type(e).__name__)}: {escape(str(e))}</span>"
            )
        finally:
            self._buttons(False)


def comparison_html(compared: Compared) -> str:
    """The comparison as one HTML fragment: the table and the overlaid figures."""
    imgs = "".join(
        f"<img alt='{escape(alt)}' style='max-width:100%' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
        for alt, png in compare_figures(compared.runs)
    )
    where = (
        f"<p class='caption'>Also in <code>{escape(str(compared.html_path))}</code></p>"
        if compared.html_path
        else ""
    )
    return f"<h4>Comparison</h4>{compare_table_html(compared.table)}{imgs}{where}"
