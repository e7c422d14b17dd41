"""sequence_parallel: split each sequence across the ranks of a job, attention included.

Only meaningful inside a job of ``sp_size`` processes: a rerun launches them
(``%%swift_profile --compare sequence_parallel(sp_size=2)``), each replays the session and
applies this toggle before the profiled cell. This file finds the models, patches attention
and writes the report; the parallel work itself lives in :mod:`swift_nb.parallel`. On every
rank it:

- splits the root models' inputs on the sequence dimension (a forward pre-hook running
  :class:`swift_nb.parallel.inputs.CallSplit`, whose docstring says what is split for
  Hugging Face and other models). A model that is not a Hugging Face model gets targets
  already aligned with its inputs; when its forward takes no ``position_ids``, positions it
  derives from its input length restart at each shard (the report says so).
- routes attention to :func:`swift_nb.parallel.ulysses_attention` or
  :func:`~swift_nb.parallel.ring_attention`: ``F.scaled_dot_product_attention`` is
  replaced while applied (``is_causal`` → ``causal``); models that declare their attention
  implementation (``config._attn_implementation``, see :mod:`swift_nb.toggles._attention`:
  Hugging Face models, the demo GPT) are switched to SDPA first. A call with an explicit
  ``attn_mask``, dropout or different query and key lengths cannot be split: it runs
  locally, attending within the rank's shard only, and the report says so.
- averages the gradients across the ranks before each ``optimizer.step()`` (a global
  optimizer step pre-hook running :func:`swift_nb.parallel.gradients.average_gradients`),
  so every rank keeps identical weights. The loss a model returns carries the whole
  sequence's mean as its value (:func:`~swift_nb.parallel.gradients.mean_over_ranks`), so
  printed loss curves match a single process. Gradient clipping before ``step()`` sees the
  rank's own gradient, not the average.

``undo()`` removes the hooks and puts attention and the models back.

Several machines. The rerun worker is an ordinary torchrun program: nothing here is
specific to one host. To run the same profiled cell across nodes, start on every node::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint HOST0:29500 --rdzv-id myjob \\
        -m swift_nb.rerun.worker spec.json

with the same ``spec.json`` (the cells and the magic line, written by
``swift_nb.rerun.Worker``; ``"toggles": [{"toggle": "sequence_parallel", "params":
{"sp_size": 16}}]``) and ``SWIFT_NB_DIR`` on a shared file system. Each worker initialises
the default process group from torchrun's environment (NCCL when CUDA is available, its
device chosen from ``LOCAL_RANK``; gloo otherwise) before replaying, so ``sp_size`` must
equal ``--nnodes × --nproc-per-node``. Rank 0 gathers every rank's profile into one job
record (see ``swift_nb.capture.job``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook

from swift_nb.core.errors import ConfigError
from swift_nb.parallel import ring_attention, ulysses_attention
from swift_nb.parallel.gradients import average_gradients, mean_over_ranks
from swift_nb.parallel.inputs import CallSplit
from swift_nb.toggles._attention import (
    attention_owners,
    attn_implementation,
    replace_sdpa,
    set_attn_implementation,
)
from swift_nb.toggles.base import Toggle, ToggleReport, hf_model


def _usage(sp_size: int) -> str:
    return (
        f"sequence_parallel runs in a rerun with sp_size worker processes "
        f"(--compare sequence_parallel(sp_size={sp_size}))"
    )


class SequenceParallel(Toggle):
    id = "sequence_parallel"
    watches_models = True

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        self._rank = 0
        self._splits: dict[int, CallSplit] = {}  # by id of the root model
        self._depth: dict[int, int] = {}  # nested forwards of a root model now running
        self._counts = {"distributed": 0, "local": 0, "grad_syncs": 0, "grad_bytes": 0}

    @property
    def processes(self) -> int:
        """Worker processes a rerun of this toggle launches (one per rank)."""
        return self.values["sp_size"]

    # -- lifecycle -------------------------------------------------------------------------

    def apply(self, namespace: Mapping[str, Any] | None = None) -> ToggleReport:
        size = self.values["sp_size"]
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(f"{_usage(size)}; torch.distributed is not initialised here")
        world = dist.get_world_size()
        if world != size:
            raise ConfigError(
                "sequence_parallel sp_size", f"must equal the number of processes of this job ({world})", size
            )
        self._rank = dist.get_rank()
        self._splits.clear()
        self._depth.clear()
        self._counts = dict.fromkeys(self._counts, 0)
        report = super().apply(namespace)
        try:
            self._route_attention()
            handle = register_optimizer_step_pre_hook(self._average_gradients)
            self._hooks.append(handle.remove)
        except BaseException:
            self.undo()
            raise
        return report

    def _finalize(self, report: ToggleReport) -> None:
        c, size, mode = self._counts, self.values["sp_size"], self.values["sp_mode"]
        report.details.update(
            sp_size=size,
            sp_mode=mode,
            attention_calls_distributed=c["distributed"],
            attention_calls_local=c["local"],
            grad_syncs=c["grad_syncs"],
            grad_bytes_per_sync=c["grad_bytes"] // max(1, c["grad_syncs"]),
        )
        if c["distributed"]:
            report.change(f"{c['distributed']} attention calls ran as {mode} attention over {size} ranks")
        if c["grad_syncs"]:
            report.change(
                f"gradients averaged across {size} ranks before {c['grad_syncs']} optimizer steps "
                f"({c['grad_bytes'] / c['grad_syncs'] / 2**20:.1f} MiB each)"
            )

    def _nothing_found(self) -> str:
        return "no model ran forward while it was applied: nothing was split"

    # -- models ----------------------------------------------------------------------------

    def _watch(self) -> None:
        """Models built while applied are caught at their first forward, like the base
        class does, and that first call is split too: hooks registered on a module during
        its own call only act from its next call, so this hook rewrites the call itself."""

        def hook(module: nn.Module, args: tuple) -> tuple | None:
            if id(module) in self._seen_modules:
                return None
            self._model(module, self._name_of(module))
            if id(module) not in self._splits:
                return None
            kwargs = _call_kwargs(module)
            if kwargs is None:
                raise RuntimeError(
                    f"sequence_parallel could not split the first call of {type(module).__name__} "
                    "(a model built inside the profiled cell); build the model in an earlier cell"
                )
            self._enter(module)
            new_args, new_kwargs = self._splits[id(module)](args, kwargs)
            kwargs.clear()
            kwargs.update(new_kwargs)
            return new_args

        handle = register_module_forward_pre_hook(hook)
        self._hooks.append(handle.remove)

    def _apply_model(self, model: nn.Module, name: str) -> None:
        assert self.report is not None
        size, mode = self.values["sp_size"], self.values["sp_mode"]
        hf = hf_model(model)
        heads = getattr(getattr(model, "config", None), "num_attention_heads", None)
        if mode == "ulysses" and heads is not None and heads % size:
            raise ConfigError(
                "sequence_parallel sp_size",
                f"must divide the number of attention heads of `{name}` ({heads}) with sp_mode=ulysses; "
                "use sp_mode=ring or an sp_size that divides it",
                size,
            )
        what = f"`{name}` ({type(model).__name__})"
        self._attention_to_sdpa(model, name)
        split = CallSplit(
            model,
            hf,
            size,
            self._rank,
            caller="sequence_parallel",
            size_option="sequence_parallel sp_size",
        )
        if hf:
            self.report.change(
                f"{what}: input ids, position ids and shifted labels split on the sequence over {size} ranks"
            )
        elif split.positions:
            self.report.change(
                f"{what}: [batch, seq, ...] inputs split on the sequence over {size} ranks; "
                "position_ids passed for each shard's place"
            )
            self.report.note(
                f"{what} is not a Hugging Face model: targets passed to it must already be aligned "
                "with its inputs (shifted before the split); outputs are the shard's"
            )
        else:
            self.report.change(f"{what}: [batch, seq, ...] inputs split on the sequence over {size} ranks")
            self.report.note(
                f"{what} is not a Hugging Face model and its forward takes no position_ids: positions "
                "it computes from its input length restart at each shard, and targets passed to it "
                "must already be aligned with its inputs (shifted before the split); outputs are the shard's"
            )
        self._splits[id(model)] = split
        self._depth[id(model)] = 0
        pre = model.register_forward_pre_hook(self._pre_forward, with_kwargs=True)
        post = model.register_forward_hook(self._post_forward, always_call=True)
        self._undo.extend([pre.remove, post.remove])

    def _pre_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if self._enter(module):
            return self._splits[id(module)](args, kwargs)
        return None

    def _enter(self, module: nn.Module) -> bool:
        """Mark the model's forward as running; False when it already is (a recursive call
        sees the shard already)."""
        self._depth[id(module)] += 1
        return self._depth[id(module)] == 1

    def _post_forward(self, module: nn.Module, args: tuple, output: Any) -> Any:
        self._depth[id(module)] -= 1
        if self._depth[id(module)] or output is None:
            return None
        if isinstance(output, torch.Tensor) and output.dim() == 0 and output.is_floating_point():
            return mean_over_ranks(output)
        loss = getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor) and loss.dim() == 0:
            output.loss = mean_over_ranks(loss)
        return None

    # -- attention -------------------------------------------------------------------------

    def _attention_to_sdpa(self, model: nn.Module, name: str) -> None:
        """Models that declare their attention implementation run SDPA, which is split."""
        assert self.report is not None
        for path, owner in attention_owners(model):
            where = f"{name}.{path}" if path else name
            before = attn_implementation(owner)
            if before == "sdpa":
                continue
            try:
                self._undo.append(set_attn_implementation(owner, "sdpa"))
            except (ValueError, ImportError) as e:
                raise ConfigError(
                    "sequence_parallel",
                    f"needs `{where}` to support sdpa attention ({e})",
                    type(owner).__name__,
                ) from None
            self.report.change(f"`{where}`: {before} attention → sdpa, so it can be split")

    def _route_attention(self) -> None:
        self._undo.append(replace_sdpa(self._distributed_attention))

    def _distributed_attention(self, original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        """``original`` (SDPA) replaced by the split attention of ``sp_mode``."""
        size, mode, chunk = self.values["sp_size"], self.values["sp_mode"], self.values["ring_chunk_size"]
        counts, report = self._counts, self.report
        inside: list[bool] = []
        assert report is not None

        def attention(
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            attn_mask: torch.Tensor | None = None,
            dropout_p: float = 0.0,
            is_causal: bool = False,
            scale: float | None = None,
            enable_gqa: bool = False,
        ) -> torch.Tensor:
            if inside:  # ulysses_attention's own local SDPA on the head shards
                return original(
                    query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
                )
            why = _local_only(query, key, attn_mask, dropout_p)
            if why:
                counts["local"] += 1
                report.note(
                    f"attention called with {why} cannot be split: it ran locally, within each rank's "
                    "shard only (its result differs from the whole sequence's)"
                )
                return original(
                    query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
                )
            if key.shape[1] != query.shape[1]:  # grouped-query attention: one K/V head per group
                rep = query.shape[1] // key.shape[1]
                key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
            counts["distributed"] += 1
            if mode == "ring":
                return ring_attention(query, key, value, causal=is_causal, scale=scale, chunk_size=chunk)
            if query.shape[1] % size:
                raise ConfigError(
                    "sequence_parallel sp_size",
                    f"must divide the number of attention heads ({query.shape[1]}) with sp_mode=ulysses; "
                    "use sp_mode=ring or an sp_size that divides it",
                    size,
                )
            inside.append(True)
            try:
                return ulysses_attention(query, key, value, causal=is_causal, scale=scale)
            finally:
                inside.pop()

        return attention

    # -- gradients -------------------------------------------------------------------------

    def _average_gradients(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._counts["grad_bytes"] += average_gradients(
            p for group in opt.param_groups for p in group["params"]
        )
        self._counts["grad_syncs"] += 1


def _local_only(query: torch.Tensor, key: torch.Tensor, mask: Any, dropout_p: float) -> str | None:
    """Why an SDPA call cannot be split across ranks, or None."""
    if query.dim() != 4:
        return f"{query.dim()}-D inputs"
    if mask is not None:
        return "an explicit attn_mask"
    if dropout_p:
        return f"dropout_p={dropout_p}"
    if query.shape[2] != key.shape[2]:
        return "query and key of different lengths"
    return None


def _call_kwargs(module: nn.Module) -> dict | None:
    """The keyword arguments of the module call now running: torch's ``_call_impl`` holds
    them in its frame (global forward pre-hooks are not given them)."""
    frame = sys._getframe(1)
    for _ in range(4):
        if frame is None:
            return None
        local = frame.f_locals
        if local.get("self") is module and isinstance(local.get("kwargs"), dict):
            return local["kwargs"]
        frame = frame.f_back
    return None
