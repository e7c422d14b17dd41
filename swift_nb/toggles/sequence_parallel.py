"""sequence_parallel: split each sequence across the ranks of a job, attention included.

Only meaningful inside a job of ``sp_size`` processes: a rerun launches them
(``%%swift_profile --compare sequence_parallel(sp_size=2)``), each replays the session and
applies this toggle before the profiled cell. On every rank it:

- splits the root models' inputs on the sequence dimension (a forward pre-hook): rank r of
  P gets tokens ``r*T/P`` to ``(r+1)*T/P - 1`` of input ids, position ids and labels.
  Hugging Face models: ``position_ids`` are passed for the shard, labels are shifted
  before the split (``shift_labels``, so no token is lost at a shard border) and
  ``num_items_in_batch`` is set so the shards' losses add up to the whole sequence's; an
  all-ones attention mask is dropped (causal attention needs none). Other models (swift_nb's
  demo GPT among them): every ``[batch, T, ...]`` tensor argument is split, so targets
  must already be aligned with the inputs; a forward that takes ``position_ids`` is given
  the shard's, otherwise positions the model derives from its input length restart at
  each shard (the report says so).
- routes attention to :func:`swift_nb.parallel.ulysses_attention` or
  :func:`~swift_nb.parallel.ring_attention`: ``F.scaled_dot_product_attention`` is
  replaced while applied (``is_causal`` → ``causal``); models that declare their attention
  implementation (``config._attn_implementation``, see :mod:`swift_nb.toggles._attention`:
  Hugging Face models, the demo GPT) are switched to SDPA first. A call with an explicit
  ``attn_mask``, dropout or different query and key lengths cannot be split: it runs
  locally, attending within the rank's shard only, and the report says so.
- averages the gradients across the ranks before each ``optimizer.step()`` (a global
  optimizer step pre-hook), so every rank keeps identical weights. Each rank's loss is the
  mean over its shard; with equal shards the average of their gradients is the whole
  sequence's gradient. The loss a model returns carries the whole sequence's mean as its
  value (one all-reduce of a scalar), so printed loss curves match a single process.
  Gradient clipping before ``step()`` sees the rank's own gradient, not the average.

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

import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook

from swift_nb.errors import ConfigError
from swift_nb.parallel import ring_attention, ulysses_attention
from swift_nb.toggles._attention import (
    attention_owners,
    attn_implementation,
    replace_sdpa,
    set_attn_implementation,
)
from swift_nb.toggles.base import Param, Toggle, ToggleReport, at_least, hf_model, one_of

_BUCKET_ELEMENTS = 1 << 22  # gradients are averaged in buckets of ≤ 16 MB (fp32)
_IGNORE = -100  # Hugging Face's ignore_index


def _usage(sp_size: int) -> str:
    return (
        f"sequence_parallel runs in a rerun with sp_size worker processes "
        f"(--compare sequence_parallel(sp_size={sp_size}))"
    )


class SequenceParallel(Toggle):
    id = "sequence_parallel"
    title = "Sequence parallelism"
    params = (
        Param("sp_size", int, 2, "ranks the sequence is split over (= worker processes)", at_least(2)),
        Param(
            "sp_mode",
            str,
            "ulysses",
            "ulysses (all-to-all of heads; heads divisible by sp_size) or ring (K/V passed around)",
            one_of("ulysses", "ring"),
            aliases=("mode",),
        ),
        Param(
            "ring_chunk_size",
            int,
            None,
            "tokens per ring-attention tile (default: the whole shard)",
            at_least(1),
            aliases=("chunk_size",),
        ),
    )
    watches_models = True

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        self._rank = 0
        self._plans: dict[int, _Plan] = {}
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
        self._plans.clear()
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
            if id(module) not in self._plans:
                return None
            kwargs = _call_kwargs(module)
            if kwargs is None:
                raise RuntimeError(
                    f"sequence_parallel could not split the first call of {type(module).__name__} "
                    "(a model built inside the profiled cell); build the model in an earlier cell"
                )
            self._enter(module)
            new_args, new_kwargs = self._split_call(module, args, kwargs)
            kwargs.clear()
            kwargs.update(new_kwargs)
            return new_args

        handle = register_module_forward_pre_hook(hook)
        self._hooks.append(handle.remove)

    def _apply_model(self, model: nn.Module, name: str) -> None:
        assert self.report is not None
        size, mode = self.values["sp_size"], self.values["sp_mode"]
        kind = "hf" if hf_model(model) else "plain"
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
        plan = _Plan(kind, _signature(model))
        if kind == "hf":
            self.report.change(
                f"{what}: input ids, position ids and shifted labels split on the sequence over {size} ranks"
            )
        elif plan.positions:
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
        self._plans[id(model)] = plan
        pre = model.register_forward_pre_hook(self._pre_forward, with_kwargs=True)
        post = model.register_forward_hook(self._post_forward, always_call=True)
        self._undo.extend([pre.remove, post.remove])

    def _pre_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if self._enter(module):
            return self._split_call(module, args, kwargs)
        return None

    def _enter(self, module: nn.Module) -> bool:
        """Mark the model's forward as running; False when it already is (a recursive call
        sees the shard already)."""
        plan = self._plans[id(module)]
        plan.depth += 1
        return plan.depth == 1

    def _post_forward(self, module: nn.Module, args: tuple, output: Any) -> Any:
        plan = self._plans[id(module)]
        plan.depth -= 1
        if plan.depth or output is None:
            return None
        if isinstance(output, torch.Tensor) and output.dim() == 0 and output.is_floating_point():
            return _whole_sequence_mean(output)
        loss = getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor) and loss.dim() == 0:
            output.loss = _whole_sequence_mean(loss)
        return None

    def _split_call(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        plan = self._plans[id(module)]
        size, rank = self.values["sp_size"], self._rank
        if plan.signature is None:
            return _split_all(args, kwargs, size, rank)
        bound = plan.signature.bind(*args, **kwargs)
        named = dict(bound.arguments)
        extra = named.pop(plan.var_keyword, {}) if plan.var_keyword else {}
        named.update(extra)
        if plan.kind == "hf":
            named = _split_hf(named, size, rank, accepts_extra=plan.var_keyword is not None)
        else:
            named = _split_plain(named, size, rank, plan.positions)
        return (), named

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
        grads = [
            p.grad
            for group in opt.param_groups
            for p in group["params"]
            if p.grad is not None and not p.grad.is_sparse
        ]
        size = self.values["sp_size"]
        nbytes = 0
        for bucket in _buckets(grads):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat)  # gloo has no AVG: sum, then divide
            flat.div_(size)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
            nbytes += flat.numel() * flat.element_size()
        self._counts["grad_syncs"] += 1
        self._counts["grad_bytes"] += nbytes


class _Plan:
    """How one root model's calls are split. ``positions``: its forward takes
    ``position_ids`` by name."""

    def __init__(self, kind: str, signature: inspect.Signature | None) -> None:
        self.kind = kind
        self.signature = signature
        self.var_keyword = None
        self.positions = False
        if signature is not None:
            self.var_keyword = next(
                (n for n, p in signature.parameters.items() if p.kind is p.VAR_KEYWORD), None
            )
            self.positions = "position_ids" in signature.parameters
        self.depth = 0


def _signature(model: nn.Module) -> inspect.Signature | None:
    """The forward's signature when every argument can be passed by name, else None."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return None
    if any(p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL) for p in sig.parameters.values()):
        return None
    return sig


def _seq_len(values: list[Any]) -> int | None:
    """The sequence length: dim 1 of the first integer [batch, T] tensor (token ids), else
    of the first tensor with at least two dimensions."""
    tensors = [v for v in values if isinstance(v, torch.Tensor) and v.dim() >= 2]
    ids = [t for t in tensors if t.dim() == 2 and not t.is_floating_point()]
    first = (ids or tensors or [None])[0]
    return None if first is None else first.shape[1]


def _check_divisible(length: int, size: int) -> None:
    if length % size:
        raise ConfigError(
            "sequence_parallel sp_size",
            f"must divide the sequence length of the model's input ({length})",
            size,
        )


def _shard(t: torch.Tensor, size: int, rank: int) -> torch.Tensor:
    n = t.shape[1] // size
    return t.narrow(1, rank * n, n).contiguous()


def _split_all(args: tuple, kwargs: dict, size: int, rank: int) -> tuple[tuple, dict]:
    """Every tensor argument of shape [batch, T, ...] split on dim 1."""
    length = _seq_len([*args, *kwargs.values()])
    if length is None:
        return args, kwargs
    _check_divisible(length, size)

    def split(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[1] == length:
            return _shard(v, size, rank)
        return v

    return tuple(split(a) for a in args), {k: split(v) for k, v in kwargs.items()}


def _split_plain(named: dict, size: int, rank: int, positions: bool) -> dict:
    """A model's named arguments for this rank's shard: every [batch, T, ...] tensor split;
    with ``positions``, ``position_ids`` of the shard when the call passes none."""
    length = _seq_len(list(named.values()))
    _, out = _split_all((), named, size, rank)
    if positions and length is not None and named.get("position_ids") is None:
        device = next(v.device for v in named.values() if isinstance(v, torch.Tensor))
        out["position_ids"] = _shard(torch.arange(length, device=device).unsqueeze(0), size, rank)
    return out


def _split_hf(named: dict, size: int, rank: int, accepts_extra: bool) -> dict:
    """A Hugging Face causal LM's arguments for this rank's shard."""
    ids, embeds = named.get("input_ids"), named.get("inputs_embeds")
    source = ids if ids is not None else embeds
    if source is None:
        return named
    if named.get("past_key_values") is not None:
        raise ConfigError(
            "sequence_parallel", "splits training forwards only (no KV cache)", "past_key_values"
        )
    batch, length = source.shape[0], source.shape[1]
    _check_divisible(length, size)
    out = dict(named)
    for key in ("input_ids", "inputs_embeds", "token_type_ids"):
        if out.get(key) is not None:
            out[key] = _shard(out[key], size, rank)
    positions = out.get("position_ids")
    if positions is None:
        positions = torch.arange(length, device=source.device).unsqueeze(0).expand(batch, -1)
    out["position_ids"] = _shard(positions, size, rank)
    mask = out.get("attention_mask")
    if mask is not None:
        # Causal attention without padding needs no mask; a padding mask is split and the
        # attention calls it produces run locally (noted by the attention wrapper).
        out["attention_mask"] = None if bool(mask.all()) else _shard(mask, size, rank)
    labels = out.get("labels")
    if labels is not None:
        if not accepts_extra:
            raise ConfigError(
                "sequence_parallel",
                "needs a model whose forward passes **kwargs to its loss (shift_labels); "
                "compute the loss outside the model from sharded labels instead",
                "labels",
            )
        shifted = out.pop("shift_labels", None)
        if shifted is None:
            shifted = F.pad(labels[:, 1:], (0, 1), value=_IGNORE)
        # Each shard's loss is its sum over num_items_in_batch/P, so the shards' losses
        # average (as the gradients are averaged) to the whole sequence's mean.
        items = out.get("num_items_in_batch")
        if items is None:
            items = (shifted != _IGNORE).sum()
        out["num_items_in_batch"] = torch.as_tensor(items, dtype=torch.float32) / size
        shard = _shard(shifted, size, rank)
        out["labels"] = shard
        out["shift_labels"] = shard
    return out


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


def _whole_sequence_mean(loss: torch.Tensor) -> torch.Tensor:
    """``loss`` with the mean over all ranks as its value and this rank's gradient."""
    with torch.no_grad():
        total = loss.detach().clone()
        dist.all_reduce(total)
        total /= dist.get_world_size()
    return loss + (total - loss.detach())


def _buckets(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Gradients grouped by dtype and device, ≤ _BUCKET_ELEMENTS per group (a larger
    gradient goes alone), in a fixed order so every rank reduces the same buckets."""
    out: list[list[torch.Tensor]] = []
    open_: dict[tuple, list[torch.Tensor]] = {}
    filled: dict[tuple, int] = {}
    for g in grads:
        key = (g.dtype, g.device)
        if key in open_ and filled[key] + g.numel() > _BUCKET_ELEMENTS:
            out.append(open_.pop(key))
        if key not in open_:
            open_[key], filled[key] = [], 0
        open_[key].append(g)
        filled[key] += g.numel()
    out.extend(open_.values())
    return out


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
