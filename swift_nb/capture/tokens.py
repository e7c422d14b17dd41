"""Tokens per step, read from what the trained model receives.

A forward pre-hook on each root model (``capture.models``) reads the call's inputs, by name
where they have one (Hugging Face's keywords) and by shape where they do not:

- **computed tokens**: batch × sequence of the token ids (``input_ids``, or the first
  two-dimensional integer tensor among the arguments; else ``inputs_embeds``): every
  position the model computes, pads included. A model fed floats only (images, features)
  has no tokens;
- **real tokens**, the first of:
  - the attention mask (``attention_mask``, 1 = a real token; a boolean
    ``*key_padding_mask``, True = a pad, as in ``nn.Transformer``): its sum;
  - packed rows (``cu_seq_lens_q``/``cu_seqlens``): the last offset;
  - ``labels``: each row up to its last label that is not -100 (right padding; a masked
    prompt before it is real);
  - otherwise every computed token (the model is told of no padding, so it attends to all);
- **packed rows**: ``position_ids`` that restart at 0 inside a row (a collator such as
  ``DataCollatorWithFlattening`` joined several samples into one row).

Only forward calls under autograd count (a reference model called under ``no_grad``, an
evaluation pass, do not); a model called inside another counted call is not counted twice:
of one call the innermost hooked module's inputs count (a Hugging Face model's decoder, the
model a wrapper runs), which is what is computed when a toggle packed the batch on the way.
Nothing synchronises with the device inside the step: the counts are summed into a tensor on
the inputs' device and read at the step's edge (CPU), or once the copy an event guards has
landed (CUDA), at a later edge or when the run ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

IGNORE_INDEX = -100
_IDS = ("input_ids", "input", "x", "src", "tokens", "idx")
_MASKS = ("attention_mask", "mask", "padding_mask")
_PAD_MASKS = ("src_key_padding_mask", "key_padding_mask", "tgt_key_padding_mask")
_CU = ("cu_seq_lens_q", "cu_seqlens", "cu_seqlens_q")
#: how the real tokens of a step were known, best first (the context's ``tokens_from``)
SOURCES = ("attention_mask", "packed", "labels", "input_ids")


def _is_int(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and not t.is_floating_point() and not t.is_complex()


def read_inputs(args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The token-bearing inputs of one forward call: ids, mask (with ``pad_true`` for a
    key-padding mask), labels, position_ids, cu_seqlens; missing ones are None."""
    kw = dict(kwargs)
    if args and isinstance(args[0], Mapping) and not kw:  # model(batch) with a dict batch
        kw, args = dict(args[0]), args[1:]
    found: dict[str, Any] = {"pad_true": False, "unsure": False}
    ids = next((kw[k] for k in _IDS if _is_int(kw.get(k)) and kw[k].dim() == 2), None)
    embeds = kw.get("inputs_embeds")
    if ids is None and isinstance(embeds, torch.Tensor) and embeds.dim() == 3:
        ids = embeds  # (batch, sequence, hidden): the tokens' embeddings
    positional = [a for a in args if isinstance(a, torch.Tensor)]
    if ids is None:  # model(ids, ...): the first 2-D tensor of integers (floats are features)
        ids = next((a for a in positional if _is_int(a) and a.dim() == 2), None)
    found["ids"] = ids
    mask = next((kw[k] for k in _MASKS if isinstance(kw.get(k), torch.Tensor)), None)
    if mask is None:
        mask = next((kw[k] for k in _PAD_MASKS if isinstance(kw.get(k), torch.Tensor)), None)
        found["pad_true"] = mask is not None and mask.dtype == torch.bool
    if mask is None and ids is not None and _is_int(ids):
        # model(ids, mask): a second tensor of the ids' shape
        same = [a for a in positional if a is not ids and a.shape == ids.shape and not a.is_floating_point()]
        mask = same[0] if same else None
        found["unsure"] = mask is not None  # model(ids, targets) has the same shape: checked
    found["mask_4d"] = mask is not None and mask.dim() == 4  # a mask of its own per (query, key)
    if mask is not None and (ids is None or mask.dim() != 2 or mask.shape[:2] != _rows(ids)):
        mask = None  # a 4-D attention mask or one of other positions: not per token
    found["mask"] = mask
    found["labels"] = kw.get("labels") if _is_int(kw.get("labels")) else None
    found["position_ids"] = kw.get("position_ids") if _is_int(kw.get("position_ids")) else None
    found["cu"] = next((kw[k] for k in _CU if _is_int(kw.get(k))), None)
    return found


def _rows(ids: torch.Tensor) -> torch.Size:
    """(batch, sequence) of token ids, or of embeddings (batch, sequence, hidden)."""
    return ids.shape[:2]


def count(found: dict[str, Any]) -> tuple[int, torch.Tensor | None, str, torch.Tensor | None] | None:
    """(computed tokens, real tokens as a 0-d tensor on the inputs' device (None: all
    computed are real), where the real count came from, restarts of position_ids inside
    rows as a 0-d tensor or None); None when the call carries no tokens."""
    ids = found["ids"]
    if ids is None or ids.dim() < 2:
        return None
    b, t = _rows(ids)
    computed = int(b) * int(t)
    packed = None
    pos = found["position_ids"]
    if pos is not None and pos.dim() == 2 and pos.shape[1] > 1:
        packed = (pos[:, 1:] == 0).sum()
    mask, cu, labels = found["mask"], found["cu"], found["labels"]
    if mask is not None:
        real = (~mask.bool()).sum() if found["pad_true"] else (mask != 0).sum()
        if found["unsure"] and mask.dtype != torch.bool:
            # a positional tensor of the ids' shape is a mask only if it holds 0 and 1 (no
            # sync: decided on the device); else (targets) every token is real
            binary = (mask.amin() >= 0) & (mask.amax() <= 1)
            real = torch.where(binary, real, torch.full_like(real, computed))
        return computed, real, "attention_mask", packed
    if cu is not None and cu.dim() == 1 and cu.numel() >= 2:
        return computed, cu[-1].to(torch.int64), "packed", packed
    if packed is not None:
        return computed, None, "packed", packed
    if labels is not None and labels.dim() == 2 and labels.shape == ids.shape[:2]:
        keep = labels != IGNORE_INDEX
        where = torch.arange(1, labels.shape[1] + 1, device=labels.device)
        return computed, (keep * where).amax(dim=1).sum(), "labels", packed
    return computed, None, "input_ids", packed


class TokenCounter:
    """Counts the tokens of each step of a run (see the module's doc). ``watch(models)``
    hooks root models (again safe: a model is hooked once); ``at_boundary(k)`` closes step
    ``k``; ``rows()`` gives {step: (tokens, real_tokens, packed_restarts)} read so far;
    ``finish()`` reads what is still on the device and removes the hooks."""

    def __init__(self) -> None:
        self._handles: list[Any] = []
        self._hooked: set[int] = set()
        self._depth = 0
        self._counting = False  # the current outermost call counts (under autograd)
        self._call: tuple[dict[str, Any], tuple] | None = None  # its innermost reading so far
        self._computed = 0
        self._real: torch.Tensor | None = None  # summed on the device within the step
        self._packed: torch.Tensor | None = None
        self._real_known = 0  # computed tokens of calls whose real count is all of them
        self._pending: list[tuple[int, int, int, Any, Any]] = []  # (step, computed, known, tensor, event)
        self.done: dict[int, tuple[int, int, int]] = {}
        self.source: str | None = None
        #: how packed rows were kept apart, as the calls showed it: "cu_seqlens" (variable-
        #: length attention's offsets), "4d_mask" (a per-query mask of its own)
        self.separated: set[str] = set()
        self.failed: str | None = None

    def watch(self, models: Iterable[nn.Module]) -> None:
        for model in models:
            inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
            get = getattr(model, "get_decoder", None)
            try:  # a Hugging Face model's decoder: what it computes, after a toggle packed the batch
                decoder = get() if callable(get) else None
            except Exception:
                decoder = None
            for m in (model, inner, decoder):
                if isinstance(m, nn.Module) and id(m) not in self._hooked:
                    self._hooked.add(id(m))
                    # run as they are, never compiled: torch.compile picks up the first frame
                    # it does not skip, which must stay the model's own forward
                    pre, post = torch.compiler.disable(self._pre), torch.compiler.disable(self._post)
                    self._handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
                    self._handles.append(m.register_forward_hook(post, always_call=True))

    def _pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._depth += 1
        if self._depth == 1:
            self._call = None
            self._counting = not self.failed and torch.is_grad_enabled()
        if not self._counting:
            return
        try:
            found = read_inputs(args, kwargs)
            got = count(found)
        except Exception as e:  # an odd input must never break the training step
            self.failed = f"{type(e).__name__}: {e}"
            self._counting = False
            return
        if got is None:
            return
        outer = self._call
        # the innermost hooked module's reading counts (what is computed), unless it tells
        # less of the same tokens (a decoder given the ids alone, its model the labels too)
        if outer is None or got[2] != "input_ids" or outer[1][0] != got[0]:
            self._call = (found, got)

    def _post(self, module: nn.Module, args: tuple, output: Any) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth == 0 and self._call is not None:
            found, got = self._call
            self._call = None
            self._add(found, *got)

    def _add(self, found: dict[str, Any], computed: int, real: Any, source: str, packed: Any) -> None:
        """One forward call's counts into the step's."""
        self._computed += computed
        if self.source is None or SOURCES.index(source) < SOURCES.index(self.source):
            self.source = source
        if real is None:
            self._real_known += computed
        else:
            real = real.detach().to(torch.int64)
            self._real = real if self._real is None else self._real + real
        if found["cu"] is not None:
            self.separated.add("cu_seqlens")
        if found["mask_4d"]:
            self.separated.add("4d_mask")
        if packed is not None:
            packed = packed.detach().to(torch.int64)
            self._packed = packed if self._packed is None else self._packed + packed

    def at_boundary(self, k: int) -> None:
        """Step ``k`` ended: keep its counts (on the device until they can be read without
        waiting) and start the next step's."""
        if self._computed:
            parts = [t for t in (self._real, self._packed) if t is not None]
            if not parts:
                self.done[k] = (self._computed, self._real_known, 0)
            else:
                values = torch.stack(
                    [
                        self._real if self._real is not None else parts[0].new_zeros(()),
                        self._packed if self._packed is not None else parts[0].new_zeros(()),
                    ]
                )
                event = None
                if values.device.type == "cuda":
                    host = torch.empty(2, dtype=torch.int64, pin_memory=True)
                    host.copy_(values, non_blocking=True)
                    event = torch.cuda.Event()
                    event.record()
                    values = host
                self._pending.append((k, self._computed, self._real_known, values, event))
        self._computed = self._real_known = 0
        self._real = self._packed = None
        self._read(wait=False)

    def _read(self, wait: bool) -> None:
        left = []
        for k, computed, known, values, event in self._pending:
            if event is not None and not wait and not event.query():
                left.append((k, computed, known, values, event))
                continue
            if event is not None:
                event.synchronize()
            real, packed = (int(v) for v in values.tolist())
            self.done[k] = (computed, real + known, packed)
        self._pending = left

    def finish(self) -> dict[int, tuple[int, int, int]]:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._read(wait=True)
        return self.done

    def add_to(self, run: Any, steps: Any, note: Callable[[str], None]) -> None:
        """steps.csv's ``tokens`` and ``real_tokens``, where the model received token ids,
        and what the run's context and summary say of them (``run``: the Run being
        finished, ``steps``: its steps table)."""
        done = self.finish()
        if self.failed:
            note(f"tokens could not be counted ({self.failed})")
        if not done or not len(steps):
            return
        for column, values in step_columns(done, steps["step"]).items():
            steps[column] = values
        if self.source is not None:
            run.context["tokens_from"] = self.source
        packed = sum(p for _, _, p in done.values())
        if packed:
            run.summary["packed_restarts"] = packed
        if self.separated:
            run.context["packed_separated_by"] = sorted(self.separated)


def step_columns(done: Mapping[int, tuple[int, int, int]], steps: Iterable[int]) -> dict[str, list[float]]:
    """steps.csv's ``tokens`` and ``real_tokens`` for ``steps`` (NaN where unknown)."""
    tokens, real = [], []
    for k in steps:
        got = done.get(int(k))
        tokens.append(float(got[0]) if got else math.nan)
        real.append(float(got[1]) if got else math.nan)
    return {"tokens": tokens, "real_tokens": real}
