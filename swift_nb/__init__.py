"""swift_nb: see where each training step's time and memory go, from a notebook or a script.

with swift_nb.profile() as run:      # or %%swift_profile on top of a notebook cell
    train()                          # every optimizer.step() ends a step
run.summary, run.steps, run.samples  # plain data, also saved in run.path
swift_nb.import_trace("traces/")      # a torch.profiler trace recorded anywhere, as a run
swift_nb.forecast(run, "H100-80GB", batch_size=32)  # will it fit? from the measured memory
swift_nb.plan(run, "L4-24GB", batch_size=16)  # what would make it fit? toggles tried, best first
swift_nb.scale(run, (1, 2, 4, 8), "nvlink4")  # will it scale? step and efficiency at N ranks
swift_nb.export(run, to="mlflow")     # or "wandb", "tensorboard": summary, series, findings, files
"""

import importlib
import sys
from typing import TYPE_CHECKING

from swift_nb.core.errors import ConfigError, RunDirError
from swift_nb.record import Run, load_run, pin, prune, runs, save

if TYPE_CHECKING:
    from swift_nb.analysis.comparison.run_diff import diff
    from swift_nb.analysis.scale import scale
    from swift_nb.api import forecast, plan, profile
    from swift_nb.capture.resources.alerts import Alert
    from swift_nb.capture.resources.link import measure_link
    from swift_nb.capture.steps import step
    from swift_nb.core.links import Link
    from swift_nb.importing.assembly import import_trace
    from swift_nb.monitor import Report, ResourceMonitor
    from swift_nb.reporting import compare, report
    from swift_nb.trackers import export

#: the package's names that need torch, imported when first used: a process that only
#: reads runs (the digest's helper process, the importer's workers) never imports torch
_LAZY = {
    "Alert": "swift_nb.capture.resources.alerts",
    "diff": "swift_nb.analysis.comparison.run_diff",
    "export": "swift_nb.trackers",
    "forecast": "swift_nb.api",
    "compare": "swift_nb.reporting",
    "plan": "swift_nb.api",
    "profile": "swift_nb.api",
    "report": "swift_nb.reporting",
    "step": "swift_nb.capture.steps",
    "timeline": "swift_nb.notebook.timeline_widget",
    "import_trace": "swift_nb.importing.assembly",
    "scale": "swift_nb.analysis.scale",
    "Link": "swift_nb.core.links",
    "measure_link": "swift_nb.capture.resources.link",
    "Report": "swift_nb.monitor",
    "ResourceMonitor": "swift_nb.monitor",
    # the sequence-parallel primitives live in swift_nb.parallel; reachable here as before
    "gather_sequence": "swift_nb.parallel",
    "ring_attention": "swift_nb.parallel",
    "shard_sequence": "swift_nb.parallel",
    "ulysses_attention": "swift_nb.parallel",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'swift_nb' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Alert",
    "ConfigError",
    "Link",
    "Report",
    "ResourceMonitor",
    "Run",
    "RunDirError",
    "compare",
    "diff",
    "export",
    "forecast",
    "import_trace",
    "load_ipython_extension",
    "load_run",
    "measure_link",
    "pin",
    "plan",
    "profile",
    "prune",
    "report",
    "runs",
    "save",
    "scale",
    "step",
    "timeline",
]
__version__ = "0.1.0"


def _results_as_html() -> None:
    """In IPython, a Forecast and a RunDiff on a cell's last line display as the render
    layer's HTML (the analysis layer holds no markup): registered with the shell's HTML
    formatter when there is one."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None:
        from swift_nb.analysis.comparison.run_diff import RunDiff
        from swift_nb.analysis.forecast import Forecast
        from swift_nb.render.comparison.run_diff import diff_html
        from swift_nb.render.forecast import forecast_html

        html = shell.display_formatter.formatters["text/html"]
        html.for_type(Forecast, forecast_html)
        html.for_type(RunDiff, diff_html)


def _prewarm() -> None:
    """In a notebook's kernel, the helper that digests profiled runs starts now, at the
    lowest priority: its imports are done while the notebook is idle, not at the end of the
    first profiled cell (``swift_nb.capture.helper``). Not in the helper itself, nor in a
    multiprocessing child (a DataLoader worker); a script's first run starts it."""
    import multiprocessing
    import os

    if os.environ.get("SWIFT_NB_HELPER_PARENT") or multiprocessing.parent_process() is not None:
        return
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    in_kernel = shell is not None and getattr(shell, "kernel", None) is not None
    if in_kernel:
        from swift_nb.capture import helper

        helper.prewarm()


_results_as_html()
_prewarm()


def load_ipython_extension(ip) -> None:
    """``%load_ext swift_nb``: registers ``%%swift_profile`` and ``%swift_runs``."""
    from swift_nb.notebook.magic import load_ipython_extension as load
    from swift_nb.rerun.history import install

    load(ip)
    install(ip)  # reruns replay the session's cells that succeeded
    _results_as_html()
