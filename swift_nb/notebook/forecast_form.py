"""The results panel's "Will it fit?" form: the levers of ``swift_nb.forecast`` (device,
batch, sequence, dtype, optimizer, toggles, ranks) over a run already measured; each press
adds a configuration to the table and the bars, without rerunning anything.

The form opens at the run's own configuration: its batch, sequence, dtype and optimizer as
the context recorded them, the batch and sequence otherwise as the traced inputs show them
(the trace's cached tables, read when the panel opens); toggles and ranks are levers on top
of the run as measured. The run's memory is measured on the first press only.

The ``model`` lever forecasts another model instead: a preset (``core.model_presets``), run
one step on fake tensors at the form's batch, sequence, dtype and optimizer (once per
configuration), with this run as its proxy.

"What would make it fit?" lists the best combinations of toggles for the form's device,
batch and sequence (``swift_nb.plan``), and "Rerun the best plan" reruns the cell with the
first that fits, through the Advice tab's rerun controls (worker processes)."""

from __future__ import annotations

from collections.abc import Callable
from html import escape

import ipywidgets as widgets
import pandas as pd

from swift_nb import vocabulary
from swift_nb.analysis.forecast import DEVICES, OPTIMIZERS, Forecast, Measured, forecast, measure
from swift_nb.analysis.throughput import batch_and_seq
from swift_nb.analysis.trace.tables import load_trace
from swift_nb.core.devices import DEFAULT_DEVICE
from swift_nb.core.errors import ConfigError, RecordError
from swift_nb.core.model_presets import PRESETS
from swift_nb.record import Run
from swift_nb.render.forecast import forecast_section
from swift_nb.render.plan import plan_html

DTYPES = ("float32", "bfloat16", "float16")


def own_shape(run: Run) -> tuple[int | None, int | None]:
    """The run's batch size and sequence length: as its context recorded them, else as its
    traced inputs show them (``throughput.batch_and_seq``); None where neither tells."""
    ctx = run.context
    batch, seq = ctx.get("batch_size"), ctx.get("seq_len")
    if (batch is None or seq is None) and run.trace_path is not None:
        try:
            traced = batch_and_seq(load_trace(run).events)
        except RecordError:  # a damaged trace: the form opens without those sizes
            traced = (None, None)
        batch = batch if batch is not None else traced[0]
        seq = seq if seq is not None else traced[1]
    return (int(batch) if batch else None, int(seq) if seq else None)


def has_memory(run: Run) -> bool:
    """Whether the run recorded memory by category (what a forecast scales from)."""
    return "activations_bytes" in run.steps and run.steps["activations_bytes"].notna().any()


class ForecastForm:
    """The form and its output; ``press()`` does what the button does (for code and tests)."""

    def __init__(self, run: Run, rerun: Callable[[list[str]], None] | None = None) -> None:
        self.run = run
        self._rerun = rerun
        self.plans: pd.DataFrame | None = None
        self._measured: Measured | None = None
        self._fake: dict[
            tuple, Measured
        ] = {}  # a preset's fake step per (model, batch, seq, dtype, optimizer)
        self.forecasts: list[Forecast] = []
        ctx = run.context
        self.device = widgets.Dropdown(options=list(DEVICES), value=DEFAULT_DEVICE, description="device")
        self.model = widgets.Dropdown(
            options=[("this model", None), *((name, name) for name in PRESETS)],
            value=None,
            description="model",
        )
        batch, seq = own_shape(run)
        # 0 stands for a size the run did not show: the forecast then takes the run's own
        self.batch = widgets.BoundedIntText(value=batch or 0, min=0, max=1 << 20, description="batch")
        self.seq = widgets.BoundedIntText(value=seq or 0, min=0, max=1 << 24, description="seq")
        dtype = str(ctx.get("dtype") or "float32")
        self.dtype = widgets.Dropdown(
            options=DTYPES, value=dtype if dtype in DTYPES else "float32", description="dtype"
        )
        optimizer = ctx.get("optimizer")
        self.optimizer = widgets.Dropdown(
            options=list(OPTIMIZERS),
            value=optimizer if optimizer in OPTIMIZERS else None,
            description="optimizer",
        )
        # every toggle of the vocabulary: a forecast prices the sharding ones too
        choices = tuple(vocabulary.TOGGLES)
        self.toggles = widgets.SelectMultiple(options=choices, rows=len(choices), description="toggles")
        self.world = widgets.BoundedIntText(value=1, min=1, max=1 << 16, description="ranks")
        self.button = widgets.Button(description="Forecast", button_style="primary")
        self.clear = widgets.Button(description="Clear")
        self.output = widgets.HTML("<p class='empty'>Pick a configuration and press Forecast.</p>")
        self.button.on_click(lambda _: self.press())
        self.clear.on_click(lambda _: self.reset())
        self.plan_button = widgets.Button(
            description="What would make it fit?", layout=widgets.Layout(width="auto")
        )
        self.rerun_best = widgets.Button(
            description="Rerun the best plan",
            icon="flask",
            disabled=True,
            layout=widgets.Layout(width="auto"),
        )
        self.plan_output = widgets.HTML("")
        self.plan_button.on_click(lambda _: self.plan())
        self.rerun_best.on_click(lambda _: self.try_best())

    def kwargs(self) -> dict:
        """``forecast()``'s keyword arguments from the form (batch or seq 0: the run's own)."""
        return {
            "device": self.device.value,
            "batch_size": self.batch.value or None,
            "seq_len": self.seq.value or None,
            "dtype": self.dtype.value,
            "optimizer": self.optimizer.value,
            "toggles": list(self.toggles.value),
            "world_size": self.world.value,
        }

    def press(self) -> Forecast | None:
        """Forecast the form's configuration and add it to those shown; a bad combination
        is said in the output, not raised."""
        try:
            if self._measured is None:
                self._measured = measure(self.run)
            if self.model.value is None:
                result = forecast(self._measured, **self.kwargs())
            else:
                result = self._forecast_model(self.model.value)
        except ConfigError as e:
            self.output.value = self._html() + f"<p class='empty'>{escape(str(e))}</p>"
            return None
        self.forecasts.append(result)
        self.output.value = self._html()
        return result

    def _forecast_model(self, name: str) -> Forecast:
        """The preset ``name`` at the form's configuration, from one step on fake tensors
        (this run its proxy) with the toggles that run there; the step is taken once per
        model, batch, sequence, dtype, optimizer and those toggles."""
        from swift_nb.model_forecast import measured_model, on_fake_model
        from swift_nb.vocabulary.forecast_spec import parse_toggles

        kw = self.kwargs()
        batch, seq = kw["batch_size"] or 1, kw["seq_len"] or 2048
        optimizer = kw["optimizer"] if kw["optimizer"] in ("AdamW", "Adam", "SGD") else "AdamW"
        on_fake = {t: p for t, p in parse_toggles(kw["toggles"]).items() if on_fake_model(t) is not None}
        key = (name, batch, seq, kw["dtype"], optimizer, repr(sorted(on_fake.items())))
        if key not in self._fake:
            self.output.value = (
                self._html() + f"<p class='empty'>Running a step of {escape(name)} on fake tensors …</p>"
            )
            self._fake[key] = measured_model(
                name, self._measured, batch, seq, kw["dtype"], optimizer, on_fake, progress=False
            )
        return forecast(self._fake[key], kw["device"], toggles=kw["toggles"], world_size=kw["world_size"])

    def plan(self) -> pd.DataFrame | None:
        """The toggles' combinations for the form's device, batch and sequence (``swift_nb.plan``),
        best first; a bad input is said in the output, not raised."""
        from swift_nb.analysis.forecast.plan import plan

        kw = self.kwargs()
        try:
            if self._measured is None:
                self._measured = measure(self.run)
            self.plans = plan(self._measured, kw["device"], None, kw["batch_size"], kw["seq_len"])
        except ConfigError as e:
            self.plan_output.value = f"<p class='empty'>{escape(str(e))}</p>"
            return None
        self.plan_output.value = plan_html(self.plans, top=5)
        best = self.best()
        self.rerun_best.disabled = self._rerun is None or best is None
        if best is not None:
            self.rerun_best.description = f"Rerun with {'+'.join(best) or 'nothing'}"
        return self.plans

    def best(self) -> list[str] | None:
        """The toggles of the best plan that fits (None: none fits, or no plan yet)."""
        from swift_nb.analysis.forecast.plan import applied_toggles

        if self.plans is None or not self.plans["fits"].any():
            return None
        return applied_toggles(self.plans.iloc[0])

    def try_best(self) -> None:
        """Rerun the cell with the best plan's toggles (the Advice tab's rerun controls)."""
        best = self.best()
        if best and self._rerun is not None:
            self._rerun(best)

    def reset(self) -> None:
        self.forecasts.clear()
        self.output.value = "<p class='empty'>Pick a configuration and press Forecast.</p>"

    def _html(self) -> str:
        return forecast_section(self.forecasts) if self.forecasts else ""

    def widget(self) -> widgets.Widget:
        levers = widgets.VBox(
            [
                widgets.HBox([self.model, self.device]),
                widgets.HBox([self.dtype, self.optimizer]),
                widgets.HBox([self.batch, self.seq, self.world]),
                widgets.HBox([self.toggles, widgets.VBox([self.button, self.clear])]),
                widgets.HBox([self.plan_button, self.rerun_best]),
            ]
        )
        title = widgets.HTML("<h4>Will it fit? Try another model, device, batch, sequence or toggles</h4>")
        return widgets.VBox(
            [title, levers, self.output, self.plan_output], _dom_classes=["swift-nb-forecast"]
        )
