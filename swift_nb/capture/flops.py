"""One step's FLOPs, counted by torch's ``FlopCounterMode`` (``options.count_flops``).

The counted step runs slower, so it is the last step before the first recorded one (its
profile is discarded anyway), else the first step after the recorded ones.
"""

from __future__ import annotations

from typing import Any

from torch.utils.flop_counter import FlopCounterMode

from swift_nb.capture.torch_profiler import ProfilerConfig


def flop_step(cfg: ProfilerConfig | None) -> int:
    """Which step to count FLOPs in, for the profiler's schedule ``cfg`` (None: no profiler)."""
    if cfg is None:
        return 1
    if cfg.wait + cfg.warmup >= 1:
        return cfg.wait + cfg.warmup - 1
    return cfg.active


class StepFlops:
    """Counts the FLOPs of step ``step``: told of every step boundary (``at_boundary``),
    it starts counting where that step begins and writes the count where it ends."""

    def __init__(self, step: int) -> None:
        self.step = step
        self._mode: FlopCounterMode | None = None

    def at_boundary(self, k: int, summary: dict[str, Any]) -> None:
        """Step ``k`` begins here: end the count (into ``summary``: ``flops_per_step``,
        ``flops_step``) if the counted step just ended, or start it if ``k`` is it."""
        if self._mode is not None and k == self.step + 1:
            self._mode.__exit__(None, None, None)
            summary["flops_per_step"] = int(self._mode.get_total_flops())
            summary["flops_step"] = self.step
            self._mode = None
        elif k == self.step:
            self._mode = FlopCounterMode(display=False)
            self._mode.__enter__()

    def stop(self) -> None:
        """The run ended inside the counted step: no full count, nothing written."""
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
