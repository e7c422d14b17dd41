"""What a run records of tensor memory by category: the optimizers' storages snapshotted
at both edges of every step the profiler records, replayed against the trace
(``memory_categories``), and the result written into the record: bytes by category at
each recorded step's peak (steps.csv) and over time (memory.csv)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pandas as pd

from swift_nb.capture.memory import categories as memcat
from swift_nb.capture.memory.logits import Lineage, lm_shape
from swift_nb.capture.torch_profiler import ProfilerConfig, TraceResult
from swift_nb.record import Run
from swift_nb.record.write import peak_step


class MemoryRecorder:
    """Snapshots for one run. ``optimizers``: a live view of the optimizers seen so far;
    ``models``: the root models the run uses (their weights that nothing trains are
    ``frozen_parameters``); ``stale``: those only alive in the kernel (their weights are
    ``other``; ``capture.memory.stale_models``); ``note``: where a problem is told (the run's
    notes). The loss's logits are followed in the recorded steps (``lineage``,
    ``capture.memory.logits``) from the heads of the models given to ``watch_heads``.
    Inactive (records nothing) without a profiler recording memory."""

    def __init__(
        self,
        cfg: ProfilerConfig | None,
        optimizers: Iterable[Any],
        note: Callable[[str], None],
        models: Callable[[], Iterable[Any]] = tuple,
        stale: Callable[[], Iterable[Any]] = tuple,
    ) -> None:
        self.cfg = cfg
        self._optimizers = optimizers
        self._models = models
        self._stale = stale
        self._note = note
        self.lineage = Lineage(note)
        self._recorded = 0  # steps recorded with the lineage armed
        self.snapshots: dict[int, memcat.Snapshot] = {}
        self.failed = False  # the parameters could not be snapshotted: no categories

    @property
    def active(self) -> bool:
        return self.cfg is not None and self.cfg.profile_memory and not self.failed

    def at_boundary(self, k: int) -> None:
        """At both edges of every step the profiler records (with memory), note what the
        optimizers hold; the replay needs them. Costs O(parameters), so only there."""
        cfg = self.cfg
        if cfg is None or not self.active:
            return
        recorded = cfg.phase(k) == "active"
        self.lineage.arm(recorded)
        self._recorded += recorded
        if recorded or (k > 0 and cfg.phase(k - 1) == "active"):
            try:
                self.snapshots[k] = memcat.snapshot(
                    self._optimizers, self._models(), carried=True, stale=self._stale()
                )
            except RuntimeError as e:  # e.g. FSDP2's sharded parameters between steps
                self._note(f"memory by category is not available for these parameters ({e})")
                self.failed = True

    def watch_heads(self, models: Iterable[Any]) -> tuple[int, int] | None:
        """Follow the logits of ``models``' LM heads (when recording memory); (vocabulary,
        hidden size) of the first language model's head, None when none is one."""
        models = list(models)
        if self.active:
            self.lineage.watch(models)
        return lm_shape(models)

    def stop(self) -> None:
        """The lineage's hooks off the models; a note where recorded steps of a language
        model had logits that could not be told."""
        lineage = self.lineage
        lineage.remove()
        if self._recorded and lineage.heads and not lineage.followed and not lineage.failed:
            self._note(
                "the loss's logits could not be told apart: no LM head known by the model "
                "(get_output_embeddings(), or a weight tied to its embedding) ran, nor a "
                "candidate whose output the model returns; they are counted among the "
                "activations and other tensors (no logits category)"
            )

    def replay_input(self) -> memcat.ReplayInput | None:
        """What the replay of a finished cycle needs (``capture.digest``): the snapshots
        taken so far and the parameters' device type; None when there is none to do."""
        if not self.active:
            return None
        return dict(self.snapshots), memcat.device_type_code(self._optimizers, self._models())

    def add_to(self, run: Run, steps: pd.DataFrame, trace: TraceResult, cuda: bool) -> None:
        """Per recorded step: category bytes at the step's peak (``steps``) and the
        category timeline (``run.memory``); the run's at the peak, one step's at its peak
        moment (``record.write.peak_step``), in the summary. On CPU (not ``cuda``) the
        replay's peak is the step's peak tensor memory; on CUDA the allocator's own peak
        stays authoritative."""
        if self.failed:
            return
        per_step = trace.memory
        if not per_step:
            return
        for c in memcat.CATEGORIES:
            steps[f"{c}_bytes"] = steps["step"].map({k: m.at_peak[c] for k, m in per_step.items()})
        if not cuda:
            steps["peak_tensor_bytes"] = steps["step"].map({k: m.peak for k, m in per_step.items()})
        else:
            steps["carried_bytes"] = steps["step"].map({k: m.carried for k, m in per_step.items()})
        frames = []
        for k, m in per_step.items():
            tl = pd.DataFrame(m.timeline, columns=["ts_us", *(f"{c}_bytes" for c in memcat.CATEGORIES)])
            start_s = steps.loc[steps["step"] == k, "start_s"].iloc[0]
            # trace clock (µs) -> run clock (s): the profiler's span of step k begins where step k does
            tl.insert(0, "step", k)
            tl.insert(0, "t_s", start_s + (tl.pop("ts_us") - m.start_us) / 1e6)
            frames.append(tl)
        run.memory = pd.concat(frames, ignore_index=True)
        at_peak = peak_step(steps)  # one step's categories at its peak moment, never a mix of steps
        if at_peak in per_step:
            run.summary["memory_categories_at_peak"] = {
                c: float(per_step[at_peak].at_peak[c]) for c in memcat.CATEGORIES
            }
