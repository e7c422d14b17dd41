"""What the data-parallel toggles (``fsdp``, ``ddp``) share: the job they need, each rank's
share of the data, optimizers moved onto the wrapped parameters, and putting the modules
back as they were.

Only meaningful inside a job of ``world_size`` processes: a rerun launches them
(``%%swift_profile --compare fsdp(world_size=2)``), every rank replays the session and
applies the toggle to the models that exist before the profiled cell; rank 0 gathers the
ranks' profiles into one job record.

Each rank's share of the data, for a cell written for one process:

- a ``DataLoader`` over a map-style dataset (in the namespace, or built while applied) gets
  a ``DistributedSampler`` in place of its sampler, shuffled when the original was: each
  rank reads ``1/world_size`` of the samples, in batches of the loader's ``batch_size``
  (the global batch is ``world_size × batch_size``, and an epoch has ``1/world_size`` of
  the steps). Each pass over the loader starts a new epoch of the sampler (a new order
  when shuffled, the same on every rank), as a training loop's ``set_epoch`` would;
- anything else (batches made by the cell, an iterable dataset): every rank runs the same
  batches. Per-rank memory and step time are then those of the job with the cell's batch
  on each rank, but the ranks learn from duplicated samples (the averaged gradient equals
  one process's). The report says which of the two happened.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable_state import _module_state_mapping
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler, SequentialSampler

from swift_nb.core.errors import ConfigError
from swift_nb.toggles.base import ToggleReport, _candidates, _on_construct, find_optimizers

_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_backward_pre_hooks",
    "_backward_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


class DataParallel:
    """What ``fsdp`` and ``ddp`` add to ``Toggle`` (``class FSDP(DataParallel, Toggle)``;
    a mixin, as every ``Toggle`` subclass is a toggle of the vocabulary): subclasses
    implement ``_wrap(model, name)``, which wraps one root model in place and returns what
    became of its parameters (``{id(old): new}``, empty when they stay the same objects)."""

    watches_models = True

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        self._moved: dict[int, nn.Parameter] = {}  # id(parameter before) -> parameter after
        self._stale: dict[int, str] = {}  # optimizers left on the whole parameters -> their names
        self._rank = 0
        self._loaders = 0

    @property
    def processes(self) -> int:
        """Worker processes a rerun of this toggle launches (one per rank)."""
        return self.values["world_size"]

    def apply(self, namespace: Mapping[str, Any] | None = None) -> ToggleReport:
        size = self.values["world_size"]
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                f"{self.id} runs in a rerun with world_size worker processes "
                f"(--compare {self.id}(world_size={size})); torch.distributed is not initialised here"
            )
        world = dist.get_world_size()
        if world != size:
            raise ConfigError(
                f"{self.id} world_size", f"must equal the number of processes of this job ({world})", size
            )
        self._rank, self._moved, self._stale, self._loaders = dist.get_rank(), {}, {}, 0
        report = super().apply(namespace)
        try:
            for name, value in _candidates(namespace or {}):
                if isinstance(value, DataLoader):
                    self._share(value, name)
            self._hooks.append(
                _on_construct(DataLoader, lambda loader: self._share(loader, "new DataLoader"))
            )
            self._hooks.append(register_optimizer_step_pre_hook(self._before_step).remove)
        except BaseException:
            self.undo()
            raise
        return report

    def _finalize(self, report: ToggleReport) -> None:
        report.details.update(world_size=self.values["world_size"], sharded_loaders=self._loaders)
        if not self._loaders:
            report.note(
                "no DataLoader was found: every rank ran the same batches (per-rank memory and time are "
                "the job's, the samples are duplicated across ranks)"
            )

    # -- models ----------------------------------------------------------------------------

    def _watch(self) -> None:
        def hook(module: nn.Module, args: Any) -> None:
            if id(module) in self._seen_modules:
                return
            self._seen_modules |= {id(m) for m in module.modules()}
            if next(module.parameters(), None) is not None:
                raise RuntimeError(
                    f"{self.id} wraps the models that exist before the profiled cell; "
                    f"{type(module).__name__} was built inside it: build it in an earlier cell"
                )

        handle = nn.modules.module.register_module_forward_pre_hook(hook)
        self._hooks.append(handle.remove)

    def _apply_model(self, model: nn.Module, name: str) -> None:
        before = {m: (type(m), set(m.__dict__), _hook_keys(m)) for m in model.modules()}
        moved = self._wrap(model, name)

        def restore() -> None:
            for m, (cls, attrs, hooks) in before.items():
                m.__class__ = cls
                # what the wrapper added (its state, "_is_fsdp_managed_module", …); public
                # attributes the cell set meanwhile stay
                for key in set(m.__dict__) - attrs:
                    if key.startswith("_"):
                        del m.__dict__[key]
                for attr, keys in hooks.items():
                    table = getattr(m, attr, None)
                    for key in set(table or ()) - keys:
                        del table[key]
                _module_state_mapping.pop(m, None)

        self._undo.append(restore)
        self._moved.update(moved)
        for opt_name, opt in self._optimizers():
            self._move_optimizer(opt, opt_name)

    def _wrap(self, model: nn.Module, name: str) -> dict[int, nn.Parameter]:
        raise NotImplementedError

    # -- optimizers ------------------------------------------------------------------------

    def _optimizers(self) -> list[tuple[str, torch.optim.Optimizer]]:
        return find_optimizers(self._namespace)

    def _before_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """An optimizer built while applied holds the parameters the model had before it
        was wrapped when it was built from them before the wrap: move it at its first step.
        One that had stepped before (left on the whole parameters) cannot step here."""
        if id(opt) in self._stale:
            raise ConfigError(
                self.id,
                f"cannot step `{self._stale[id(opt)]}`: it stepped before the model was wrapped and its "
                "state is per whole parameter; build the optimizer in the profiled cell "
                "(opt = torch.optim.AdamW(model.parameters()))",
                type(opt).__name__,
            )
        if id(opt) not in self._seen_optimizers:
            self._seen_optimizers.add(id(opt))
            self._move_optimizer(opt, self._name_of(opt))

    def _move_optimizer(self, opt: torch.optim.Optimizer, name: str) -> None:
        """Point ``opt``'s parameter groups at the wrapped parameters (back again on undo).
        One that has stepped already keeps its parameters (its state is per whole
        parameter): it is remembered, and refused if the cell steps it."""
        assert self.report is not None
        self._seen_optimizers.add(id(opt))
        if not self._moved:
            return
        held = [p for group in opt.param_groups for p in group["params"] if id(p) in self._moved]
        if any(opt.state.get(p) for p in held):
            self._stale[id(opt)] = name
            self.report.note(
                f"`{name}` ({type(opt).__name__}) has stepped already: left on the whole parameters (an "
                "optimizer built in the profiled cell trains the shards)"
            )
            return
        swapped: list[tuple[list, int, nn.Parameter]] = []
        for group in opt.param_groups:
            params = group["params"]
            for i, p in enumerate(params):
                new = self._moved.get(id(p))
                if new is not None:
                    params[i] = new
                    swapped.append((params, i, p))
        if swapped:
            self._undo.append(lambda: self._move_back(opt, swapped))

    def _move_back(self, opt: torch.optim.Optimizer, swapped: list[tuple[list, int, nn.Parameter]]) -> None:
        """The original parameters back in ``opt``, its state made whole (the wrapped
        parameters' state may be shards: gathered on every rank)."""
        for params, i, old in swapped:
            new = params[i]
            params[i] = old
            state = opt.state.pop(new, None)
            if state:
                opt.state[old] = {k: _whole(v) for k, v in state.items()}

    # -- data --------------------------------------------------------------------------------

    def _share(self, loader: DataLoader, name: str) -> None:
        """Give this rank its share of ``loader``'s samples (see the module's docstring)."""
        assert self.report is not None
        sampler = loader.sampler
        if isinstance(sampler, DistributedSampler):
            return
        if loader.batch_size is None or not isinstance(sampler, (RandomSampler, SequentialSampler)):
            self.report.note(
                f"`{name}` has its own sampler or batch sampler (or an iterable dataset): every rank reads "
                "all of it"
            )
            return
        shared = _EveryPass(
            loader.dataset,
            num_replicas=self.values["world_size"],
            rank=self._rank,
            shuffle=isinstance(sampler, RandomSampler),
            drop_last=loader.drop_last,
        )
        batches = loader.batch_sampler
        object.__setattr__(loader, "sampler", shared)
        object.__setattr__(loader, "batch_sampler", BatchSampler(shared, loader.batch_size, loader.drop_last))

        def restore() -> None:
            object.__setattr__(loader, "sampler", sampler)
            object.__setattr__(loader, "batch_sampler", batches)

        self._undo.append(restore)
        self._loaders += 1
        self.report.change(
            f"`{name}`: DistributedSampler over {self.values['world_size']} ranks "
            f"({len(shared)} of {len(loader.dataset)} samples on each, batches of {loader.batch_size})"
        )


class _EveryPass(DistributedSampler):
    """A DistributedSampler that moves to its next epoch at each pass, so a shuffled
    loader reads a new order every epoch without the cell calling ``set_epoch``."""

    def __iter__(self):
        order = super().__iter__()
        self.set_epoch(self.epoch + 1)
        return order


def _hook_keys(m: nn.Module) -> dict[str, set]:
    return {attr: set(getattr(m, attr, None) or ()) for attr in _HOOK_DICTS}


def _whole(t: Any) -> Any:
    """A DTensor gathered into a plain tensor (a collective: every rank calls it); anything
    else as it is."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


def restore_parameters(
    owners: list[tuple[nn.Module, str, nn.Parameter, torch.Size]],
) -> Callable[[], None]:
    """The function that puts each ``(module, name, parameter, shape)`` back on its module,
    holding the values the module's present parameter has there (gathered on every rank
    when it is sharded)."""

    def restore() -> None:
        done: set[int] = set()
        for module, pname, old, shape in owners:
            new = module._parameters.get(pname)
            if new is not None and new is not old and id(old) not in done:
                done.add(id(old))
                old.data = _whole(new.detach()).reshape(shape)
            module._parameters[pname] = old

    return restore
