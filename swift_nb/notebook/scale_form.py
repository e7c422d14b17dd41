"""The results panel's "Will it scale?" form, beside "Will it fit?": the levers of
``swift_nb.scale`` (world sizes, link, layouts, nodes, gradient dtype) over a run already
measured; each press shows the table and the efficiency plot, without rerunning anything.
A link the run measured (``swift_nb.measure_link()`` inside its ``profile()``) is offered
first."""

from __future__ import annotations

import ipywidgets as widgets
import pandas as pd

from swift_nb.analysis.scale import PRESETS, scale
from swift_nb.core.errors import ConfigError
from swift_nb.record import Run
from swift_nb.render.scale import scale_section

MEASURED = "measured (this run)"


def can_scale(run: Run) -> bool:
    """A run of one process with a step time and a trace (what ``scale`` reads)."""
    return len(run.ranks) == 0 and run.trace_path is not None and bool(run.summary.get("step_time_median_s"))


class ScaleForm:
    """The form and its output; ``press()`` does what the button does (for code and tests)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.table: pd.DataFrame | None = None
        links = ([MEASURED] if run.context.get("link") else []) + list(PRESETS)
        self.world_sizes = widgets.Text(value="1, 2, 4, 8", description="ranks")
        self.link = widgets.Dropdown(options=links, value=links[0], description="link")
        self.ddp = widgets.Checkbox(value=True, description="DDP", indent=False)
        self.fsdp = widgets.Checkbox(value=True, description="FSDP", indent=False)
        self.nodes = widgets.BoundedIntText(value=1, min=1, max=4096, description="nodes")
        self.grad = widgets.Dropdown(
            options=[("as stored", None), ("bf16", "bf16")], value=None, description="grads"
        )
        self.button = widgets.Button(description="Will it scale?", button_style="primary")
        self.out = widgets.HTML()
        self.button.on_click(lambda _: self.press())

    def kwargs(self) -> dict:
        try:
            sizes = [int(s) for s in self.world_sizes.value.replace(",", " ").split()]
        except ValueError:
            raise ConfigError(
                "world_sizes", "give numbers of ranks, e.g. 1, 2, 4, 8", self.world_sizes.value
            ) from None
        layouts = [name for name, box in (("ddp", self.ddp), ("fsdp", self.fsdp)) if box.value]
        link = self.run.context["link"] if self.link.value == MEASURED else self.link.value
        return {
            "world_sizes": sizes,
            "link": link,
            "layouts": layouts,
            "nodes": self.nodes.value if self.nodes.value > 1 else None,
            "grad_dtype": self.grad.value,
        }

    def press(self) -> pd.DataFrame | None:
        try:
            self.table = scale(self.run, **self.kwargs())
        except ConfigError as e:
            self.out.value = f"<p class='error'>{e}</p>"
            return None
        self.out.value = scale_section(self.table)
        return self.table

    def widget(self) -> widgets.Widget:
        levers = widgets.VBox(
            [
                widgets.HBox([self.world_sizes, self.link]),
                widgets.HBox([self.ddp, self.fsdp, self.nodes, self.grad]),
                self.button,
            ]
        )
        return widgets.VBox([widgets.HTML("<h4>Will it scale?</h4>"), levers, self.out])
