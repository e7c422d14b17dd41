"""A model's call split on the sequence: each rank runs the forward on its contiguous shard.

Rank r of P gets tokens ``r*T/P`` to ``(r+1)*T/P - 1`` of every split input, the layout of
:func:`~swift_nb.parallel.shard_sequence` that the sequence-parallel attentions expect.

- Hugging Face causal LMs: input ids (or embeddings) and token type ids are split and the
  shard's ``position_ids`` passed; labels are shifted before the split (``shift_labels``, so
  no token is lost at a shard border) and ``num_items_in_batch`` is set so the shards'
  losses average to the whole sequence's mean; an all-ones attention mask is dropped
  (causal attention needs none), a padding mask is split.
- Other models: every ``[batch, T, ...]`` tensor argument is split, so targets must already
  be aligned with the inputs; a forward that takes ``position_ids`` is given the shard's
  when the call passes none.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from swift_nb.core.errors import ConfigError
from swift_nb.parallel._sequence import shard

IGNORE_INDEX = -100  # Hugging Face's: label positions that count in no loss


class CallSplit:
    """How the calls of ``model`` are split into shard ``rank`` of ``size``.

    ``hf``: the model is a Hugging Face causal LM (its arguments are split by name, see the
    module's docstring). ``positions``: its forward takes ``position_ids`` by name.
    ``caller`` and ``size_option`` name, in the ConfigError a call that cannot be split raises,
    what split it and the setting ``size`` came from (``sequence_parallel sp_size``).
    """

    def __init__(
        self,
        model: nn.Module,
        hf: bool,
        size: int,
        rank: int,
        *,
        caller: str = "CallSplit",
        size_option: str = "size",
    ) -> None:
        self.hf, self.size, self.rank = hf, size, rank
        self.caller, self.size_option = caller, size_option
        self.signature = _signature(model)
        self.var_keyword: str | None = None
        self.positions = False
        if self.signature is not None:
            params = self.signature.parameters
            self.var_keyword = next((n for n, p in params.items() if p.kind is p.VAR_KEYWORD), None)
            self.positions = "position_ids" in params

    def __call__(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """This rank's arguments for a call of the model with ``args`` and ``kwargs``."""
        if self.signature is None:
            return self._split_all(args, kwargs)
        named = dict(self.signature.bind(*args, **kwargs).arguments)
        if self.var_keyword:
            named.update(named.pop(self.var_keyword, {}))
        return (), self._split_hf(named) if self.hf else self._split_plain(named)

    def _shard(self, t: torch.Tensor) -> torch.Tensor:
        return shard(t, self.size, self.rank, dim=1).contiguous()

    def _check_divisible(self, length: int) -> None:
        if length % self.size:
            raise ConfigError(
                self.size_option,
                f"must divide the sequence length of the model's input ({length})",
                self.size,
            )

    def _split_all(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Every tensor argument of shape [batch, T, ...] split on dim 1."""
        length = _seq_len([*args, *kwargs.values()])
        if length is None:
            return args, kwargs
        self._check_divisible(length)

        def split(v: Any) -> Any:
            if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[1] == length:
                return self._shard(v)
            return v

        return tuple(split(a) for a in args), {k: split(v) for k, v in kwargs.items()}

    def _split_plain(self, named: dict) -> dict:
        """A model's named arguments for this rank's shard: every [batch, T, ...] tensor split;
        when its forward takes ``position_ids`` and the call passes none, the shard's."""
        length = _seq_len(list(named.values()))
        _, out = self._split_all((), named)
        if self.positions and length is not None and named.get("position_ids") is None:
            device = next(v.device for v in named.values() if isinstance(v, torch.Tensor))
            out["position_ids"] = self._shard(torch.arange(length, device=device).unsqueeze(0))
        return out

    def _split_hf(self, named: dict) -> dict:
        """A Hugging Face causal LM's arguments for this rank's shard."""
        ids, embeds = named.get("input_ids"), named.get("inputs_embeds")
        source = ids if ids is not None else embeds
        if source is None:
            return named
        if named.get("past_key_values") is not None:
            raise ConfigError(self.caller, "splits training forwards only (no KV cache)", "past_key_values")
        batch, length = source.shape[0], source.shape[1]
        self._check_divisible(length)
        out = dict(named)
        for key in ("input_ids", "inputs_embeds", "token_type_ids"):
            if out.get(key) is not None:
                out[key] = self._shard(out[key])
        positions = out.get("position_ids")
        if positions is None:
            positions = torch.arange(length, device=source.device).unsqueeze(0).expand(batch, -1)
        out["position_ids"] = self._shard(positions)
        mask = out.get("attention_mask")
        if mask is not None:
            # Causal attention without padding needs no mask; a padding mask is split and the
            # attention calls it produces cannot be split across ranks.
            out["attention_mask"] = None if bool(mask.all()) else self._shard(mask)
        labels = out.get("labels")
        if labels is not None:
            if self.var_keyword is None:
                raise ConfigError(
                    self.caller,
                    "needs a model whose forward passes **kwargs to its loss (shift_labels); "
                    "compute the loss outside the model from sharded labels instead",
                    "labels",
                )
            shifted = out.pop("shift_labels", None)
            if shifted is None:
                shifted = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
            # Each shard's loss is its sum over num_items_in_batch/P, so the shards' losses
            # average (as the gradients are averaged) to the whole sequence's mean.
            items = out.get("num_items_in_batch")
            if items is None:
                items = (shifted != IGNORE_INDEX).sum()
            out["num_items_in_batch"] = torch.as_tensor(items, dtype=torch.float32) / self.size
            out["labels"] = out["shift_labels"] = self._shard(shifted)
        return out


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
