"""swift_nb: see where each training step's time and memory go, from a notebook or a script."""

from swift_nb.capture.session import profile
from swift_nb.capture.steps import step
from swift_nb.record import Run, load_run, pin, prune, runs, save

__all__ = ["Run", "load_run", "pin", "profile", "prune", "runs", "save", "step"]
__version__ = "0.1.0"
