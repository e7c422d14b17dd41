"""packing: each batch's samples packed into one row without padding, attention kept exact.

A padded batch of B rows × T positions holds the real tokens of B samples and pads; the
model computes every position. Under this toggle a Hugging Face model's forward is given
the real tokens alone, in one row, sample after sample (the same samples in the same step:
nothing is regrouped), with ``position_ids`` that restart at 0 for each sample. What keeps
the samples apart is chosen by the model's attention kernel:

- FlashAttention-2/3 (CUDA) reads the samples' bounds from ``position_ids`` and runs its
  variable-length kernel: no mask at all;
- any other kernel (sdpa, eager, on any device) gets a block-diagonal causal mask, 4-D and
  additive, N × N for the row's N real tokens: exact, at N² mask entries.

The labels go with their tokens, and the first token of each sample after the first is not
predicted from the sample before it (-100, as ``DataCollatorWithFlattening`` sets it), so
the loss per real token is the padded batch's. A call without ``labels=`` (the caller
computes its loss from the logits) gets ``outputs.logits`` back in the batch's own shape
(B × T, zeros at the pads); a call with labels gets the packed row's logits (1 × N), since
unpacking them would cost a B × T × V tensor for what only ``.loss`` is read from.

The real tokens are told by the ``attention_mask`` (1 = real), else by the ``labels`` (each
row up to its last label that is not -100). A call with neither is refused, naming why: the
pads cannot be told apart. Other per-token inputs (any tensor of the batch's B × T shape:
``token_type_ids``, ``inputs_embeds``) are packed as the tokens are; positional arguments
past ``input_ids, attention_mask`` are refused, since packing cannot tell what they are.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from swift_nb.core.errors import ConfigError
from swift_nb.toggles.base import Toggle, find_models, hf_model

IGNORE_INDEX = -100
VARLEN = ("flash_attention_2", "flash_attention_3")
#: what a wrapped forward carries: the function it calls, which a later toggle (fused_ce)
#: may wrap in turn, so that the loss is computed on the packed row
INNER = "_swift_nb_inner"
#: what a call may give by position (a Hugging Face model's order)
POSITIONAL = ("input_ids", "attention_mask")
#: what packing sets itself: every other tensor of the batch's (B, T) shape is packed as the tokens are
OWN = ("input_ids", "attention_mask", "labels", "position_ids")
NEEDS = "a Hugging Face model (a transformers PreTrainedModel whose forward takes position_ids=)"


def packable(model: nn.Module) -> nn.Module | None:
    """The outermost Hugging Face model inside ``model`` whose forward takes position_ids."""
    for m in model.modules():
        if hf_model(m) and "position_ids" in inspect.signature(m.forward).parameters:
            return m
    return None


def real_mask(ids: torch.Tensor, mask: torch.Tensor | None, labels: torch.Tensor | None) -> torch.Tensor:
    """Which positions of the (B, T) batch hold real tokens."""
    if mask is not None and mask.dim() == 2:
        return mask != 0
    assert labels is not None
    where = torch.arange(1, labels.shape[1] + 1, device=labels.device)
    last = ((labels != IGNORE_INDEX) * where).amax(dim=1, keepdim=True)
    return where[None, :] <= last


class Packed:
    """One batch packed: the real tokens' flat indices, each one's sample and position in it."""

    def __init__(self, real: torch.Tensor) -> None:
        self.shape = real.shape
        self.index = real.flatten().nonzero().squeeze(1)
        self.sample = self.index // real.shape[1]
        self.position = (real.long().cumsum(1) - 1).flatten()[self.index]

    def take(self, t: torch.Tensor) -> torch.Tensor:
        """The real tokens' rows of a (B, T, …) tensor, as one (1, N, …) row."""
        return t.flatten(0, 1)[self.index][None]

    def labels(self, labels: torch.Tensor) -> torch.Tensor:
        packed = self.take(labels).clone()
        packed[0, self.position == 0] = IGNORE_INDEX  # not predicted from the sample before
        return packed

    def mask(self, dtype: torch.dtype) -> torch.Tensor:
        """The block-diagonal causal mask, additive, (1, 1, N, N)."""
        n = self.index.numel()
        order = torch.arange(n, device=self.index.device)
        allowed = (self.sample[:, None] == self.sample[None, :]) & (order[:, None] >= order[None, :])
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )[None, None]

    def unpack(self, t: torch.Tensor) -> torch.Tensor:
        """A (1, N, …) tensor back in the batch's (B, T, …) shape, zeros at the pads."""
        b, s = self.shape
        full = t.new_zeros((b * s, *t.shape[2:]))
        return full.index_copy(0, self.index, t[0]).view(b, s, *t.shape[2:])


class Packing(Toggle):
    id = "packing"
    watches_models = True

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        self._stats = {"calls": 0, "tokens": 0, "real": 0}

    def apply(self, namespace=None):
        models = find_models(namespace or {})
        if models and not any(packable(m) for _, m in models):
            names = ", ".join(f"`{n}` ({type(m).__name__})" for n, m in models)
            raise ConfigError(
                "packing", f"found no model it can pack for among {names}: it needs {NEEDS}", "packing"
            )
        return super().apply(namespace)

    def _apply_model(self, model: nn.Module, name: str) -> None:
        target = packable(model)
        if target is None:
            raise ConfigError(
                "packing", f"`{name}` ({type(model).__name__}) cannot be packed: it needs {NEEDS}", "packing"
            )
        report = self.report
        assert report is not None
        attn = getattr(getattr(target, "config", None), "_attn_implementation", None) or ""
        varlen = any(v in attn for v in VARLEN)
        state = {"inner": target.forward}
        stats = self._stats
        dtype = next(target.parameters()).dtype

        def forward(*args: Any, **kwargs: Any) -> Any:
            if len(args) > len(POSITIONAL):
                raise ConfigError(
                    "packing",
                    f"`{name}` was given {len(args)} positional arguments; packing reads "
                    f"{' and '.join(POSITIONAL)} by position and the rest by name: pass the others as "
                    "keywords (e.g. labels=...), or run without packing",
                    "packing",
                )
            kwargs.update(zip(POSITIONAL, args, strict=False))
            ids, mask, labels = kwargs.get("input_ids"), kwargs.get("attention_mask"), kwargs.get("labels")
            if ids is None or ids.dim() != 2:
                return state["inner"](**kwargs)
            if (mask is None or mask.dim() != 2) and labels is None:
                raise ConfigError(
                    "packing",
                    f"`{name}` received neither an attention_mask nor labels, so its pads cannot be told apart "
                    "from its tokens: pass attention_mask= (1 = a real token), or run without packing",
                    "packing",
                )
            real = real_mask(ids, mask, labels)
            packed = Packed(real)
            stats["calls"] += 1
            stats["tokens"] += ids.numel()
            stats["real"] += packed.index.numel()
            for key, value in kwargs.items():  # per-token inputs (token_type_ids, inputs_embeds …)
                if key not in OWN and isinstance(value, torch.Tensor) and value.shape[:2] == ids.shape:
                    kwargs[key] = packed.take(value)
            kwargs["input_ids"] = packed.take(ids)
            kwargs["position_ids"] = packed.position[None]
            kwargs["attention_mask"] = None if varlen else packed.mask(dtype)
            if labels is not None:
                kwargs["labels"] = packed.labels(labels)
            out = state["inner"](**kwargs)
            logits = out.get("logits") if hasattr(out, "get") else None
            # the caller computes its loss from the logits: in the batch's shape (B × T × V);
            # with labels= the model computed it, and the packed row's logits are kept as they are
            if (
                labels is None
                and isinstance(logits, torch.Tensor)
                and logits.shape[1:2] == (packed.index.numel(),)
            ):
                out["logits"] = packed.unpack(logits)
            return out

        setattr(forward, INNER, state)
        forward.__wrapped__ = state["inner"]  # type: ignore[attr-defined]  # its signature, for inspect
        target.forward = forward
        self._undo.append(lambda: target.__dict__.pop("forward", None))
        how = (
            "FlashAttention's variable-length kernel (position_ids)"
            if varlen
            else "a block-diagonal causal mask"
        )
        report.change(
            f"{name}: each batch's real tokens packed into one row, samples kept apart by {how}; the same samples "
            "per step, the loss per real token unchanged; with labels=, outputs.logits holds the packed row (1 × N)"
        )
        report.details["separated_by"] = "position_ids" if varlen else "4d_mask"

    def _finalize(self, report) -> None:
        s = self._stats
        report.details.update(packed_calls=s["calls"], tokens=s["tokens"], real_tokens=s["real"])
        if s["tokens"]:
            report.details["padding_removed_pct"] = round(100.0 * (1 - s["real"] / s["tokens"]), 2)

    def _nothing_found(self) -> str:
        return f"no model was found in the namespace: it needs {NEEDS}"
