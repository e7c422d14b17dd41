"""What fine-tuning changes in a forecast: the linear layers LoRA adapts and the elements
its adapters hold (``adapters``), and the frozen weights' bytes at their dtype or at 4-bit
NF4 (``frozen_weights``).

The linear layers come from the run's ``context["finetune"]["linear_shapes"]`` where the
capture recorded them (``[[name, out, in, count], ...]`` by module name, LoRA's own
layers left out: named targets are then exact), else from the trace's ``aten::linear``
weights (no names: ``targets=auto`` is exact, named targets are taken as d×d layers in
each block), else from square d×d matrices holding the model's parameters. The output
layer (as wide as the vocabulary) is never adapted nor quantized, as peft's
``all-linear`` and transformers' 4-bit loading leave it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from swift_nb.analysis import effects
from swift_nb.analysis.effects import LoRA
from swift_nb.analysis.forecast.measure import Measured
from swift_nb.core.errors import ConfigError
from swift_nb.core.units import fmt_bytes
from swift_nb.vocabulary.forecast_spec import DTYPE_BYTES

Layers = dict[tuple[int, int], int]  # (out, in) → how many

#: the dtype a 4-bit base computes in (QLoRA's bnb_4bit_compute_dtype), and holds the
#: weights it does not quantize in
QLORA_COMPUTE_DTYPE = "bfloat16"
_OUTPUT_NAMES = ("lm_head", "output", "embed_out")
#: parameters of one transformer block per d² (4 attention and 8 MLP: d×d q, k, v, o and
#: two d×4d), to find d when neither the trace nor the context says it
_BLOCK_PARAMS_PER_D2 = 12


def _n(x: float) -> str:
    return f"{x:,.0f}"


@dataclass(frozen=True)
class Adapters:
    """LoRA adapters a configuration trains: ``elements`` trainable in all; ``matrices``:
    the adapters' weights (A r×in, B out×r) → how many; ``layers``: how many linear layers
    they adapt, ``inputs``: those layers' input widths summed; ``new``: whether the run
    trained none of them (their own activations are then added); ``how``: in words."""

    lora: LoRA
    elements: float
    matrices: Layers
    layers: int
    inputs: int
    new: bool
    how: str


def adapters(m: Measured, lora: LoRA) -> Adapters:
    """The adapters ``lora`` trains on ``m``'s model: the run's own at another rank when it
    trained LoRA on the same targets, else r·(in + out) for each targeted layer."""
    r, r0 = lora.rank, m.lora_rank
    if r0 is not None and (not lora.targets or _same(lora.targets, m.finetune.get("target_modules"))):
        return _rerank(m, lora, r0)
    layers, how = targets(m, lora.targets)
    matrices: Counter = Counter()
    for (a, b), k in layers.items():
        matrices[(r, b)] += k
        matrices[(a, r)] += k
    elements = effects.lora_params(layers, r)
    count = sum(layers.values())
    text = f"LoRA r={r} adapters on {count} linear layers {how}: Σ r·(in + out) = {_n(elements)} elements" + (
        f" (the run's r={r0} adapters replaced)" if r0 is not None else " (the model's weights frozen)"
    )
    return Adapters(
        lora, elements, dict(matrices), count, sum(b * k for (_, b), k in layers.items()), r0 is None, text
    )


def _rerank(m: Measured, lora: LoRA, r0: int) -> Adapters:
    """The run's own adapters at rank ``lora.rank``: its A (r0×in) and B (out×r0) weights in
    the trace scaled to r; what else it trained (a classifier head) kept."""
    r = lora.rank
    own = {s: k for s, k in m.matrices.items() if r0 in s}
    in_own = sum(a * b * k for (a, b), k in own.items())
    targets_text = _targets_text(m.finetune.get("target_modules"))
    rank = f"at rank {r} instead of {r0}" if r != r0 else f"at the run's rank {r}"
    if not own or in_own > m.params * 1.001:
        elements = m.params * r / r0
        return Adapters(
            lora,
            elements,
            {},
            0,
            0,
            False,
            f"the run's LoRA adapters ({targets_text}) {rank}: "
            f"{_n(m.params)} × {r}/{r0} = {_n(elements)} elements (the trace has no adapter shapes)",
        )
    matrices = {(r if a == r0 else a, r if b == r0 else b): k for (a, b), k in own.items()}
    scaled = sum(a * b * k for (a, b), k in matrices.items())
    first = {b: k for (a, b), k in own.items() if a == r0}  # A: r0 × in
    rest = max(0.0, m.params - in_own)
    text = (
        f"the run's LoRA adapters ({targets_text}, {sum(first.values())} layers) {rank}: "
        f"{_n(in_own)} × {r}/{r0} = {_n(scaled)} elements"
        + (f" + {_n(rest)} other trainable parameters" if rest else "")
    )
    return Adapters(
        lora,
        scaled + rest,
        matrices,
        sum(first.values()),
        sum(b * k for b, k in first.items()),
        False,
        text,
    )


def targets(m: Measured, names: tuple[str, ...]) -> tuple[Layers, str]:
    """The linear layers LoRA with ``names`` adapts ((out, in) → how many; none named: every
    one but the output layer), and where their shapes come from."""
    recorded = _recorded(m.finetune)
    if recorded:
        if not names:
            return base_layers(m)
        picked: Counter = Counter()
        for name, a, b, k in recorded:
            if _matches(name, names):
                picked[(a, b)] += k
        if not picked:
            known = ", ".join(sorted({n for n, *_ in recorded}))
            raise ConfigError(
                "lora targets", f"must name linear layers of the model ({known})", "|".join(names)
            )
        return dict(picked), "(shapes recorded by the capture)"
    if not names:
        return base_layers(m)
    if m.blocks < 1:
        raise ConfigError(
            "lora targets",
            "named targets need the number of repeated blocks, and the trace shows no attention layers: "
            "profile with context={'n_layer': L}, or take targets=auto",
            "|".join(names),
        )
    d, source = _width(m)
    count = len(names) * m.blocks
    return {(d, d): count}, (
        f"(assumed: {', '.join(names)} each a {d}×{d} layer in each of the {m.blocks} blocks, d {source}; "
        "the run did not record its layers' names)"
    )


def base_layers(m: Measured) -> tuple[Layers, str]:
    """The model's linear layers but its output layer, and where their shapes come from:
    recorded by the capture, else the trace's (LoRA's own left out), else square d×d
    matrices holding the model's parameters."""
    recorded = adapted_layers(m.finetune, m.vocab)
    if recorded:
        return recorded, "(shapes recorded by the capture)"
    r0 = m.lora_rank
    model = m.frozen_params if r0 is not None else m.params
    traced = {s: k for s, k in m.matrices.items() if r0 is None or r0 not in s}
    if traced and sum(a * b * k for (a, b), k in traced.items()) <= (m.params + m.frozen_params) * 1.001:
        layers = {s: k for s, k in traced.items() if not _output("", *s, m.vocab)} or traced
        return layers, "(shapes from the trace)"
    d = m.hidden or max(1, math.isqrt(max(1, model)))
    k = max(1, model // (d * d))
    source = "the model width from the trace" if m.hidden else "√(parameter count)"
    return {(d, d): k}, f"(assumed: {k} square {d}×{d} matrices, {source}; the trace has no linear shapes)"


def frozen_weights(m: Measured, lora: LoRA | None, dtype: str | None) -> tuple[float, list[str]]:
    """Bytes of a configuration's frozen weights, and a phrase for each part: the run's own
    (at ``dtype``, each at its own when None; 4-bit NF4 under a new QLoRA; packed as
    measured when the run quantized them), and under new LoRA adapters the weights the run
    trained, now frozen."""
    held, texts = _held(m, lora, dtype)
    if lora is not None and m.lora_rank is None and m.params:
        if lora.quantized:
            moved, text = _quantized(m, m.params, dtype)
            texts.append(f"the model's {_n(m.params)} parameters, now frozen: {text}")
        else:
            e = DTYPE_BYTES[dtype or m.dtype]
            moved = m.params * e
            texts.append(f"the model's {_n(m.params)} parameters, now frozen, × {e} B ({dtype or m.dtype})")
        held += moved
    return held, texts


def dequantized_copy(m: Measured, dtype: str | None) -> tuple[float, str]:
    """The largest weight a 4-bit layer dequantizes for its matmul (one at a time, in
    forward and again in backward), in bytes, and its shape."""
    layers, _ = base_layers(m)
    if not layers:
        return 0.0, "no linear layer"
    a, b = max(layers, key=lambda s: s[0] * s[1])
    e = DTYPE_BYTES[qlora_compute_dtype(dtype)]
    return float(a * b * e), f"{a}×{b} × {e} B"


def _held(m: Measured, lora: LoRA | None, dtype: str | None) -> tuple[float, list[str]]:
    """The run's own frozen weights in the configuration, and the phrase."""
    f0, n0 = m.categories["frozen_parameters"], m.frozen_params
    if not m.frozen_measured:
        return 0.0, ["the run's own not measured (it was recorded before frozen weights were), taken as 0"]
    if not f0:
        return 0.0, []
    if m.quantization:
        if lora is None or lora.quantized:
            return f0, [
                f"{fmt_bytes(f0)} as measured ({m.quantization}: packed, with its quantization state)"
            ]
        e = DTYPE_BYTES[qlora_compute_dtype(dtype)]
        return n0 * e, [
            f"the run's {m.quantization} base unquantized, {_n(n0)} × {e} B ({qlora_compute_dtype(dtype)})"
        ]
    ef0 = DTYPE_BYTES.get(m.frozen_dtype, 0)
    buffers = f0 - n0 * ef0
    if lora is not None and lora.quantized and m.lora_rank is not None and buffers >= -0.001 * f0:
        value, text = _quantized(m, n0, dtype)
        extra = max(0.0, buffers)
        return value + extra, [
            f"the base's {text}" + (f" + {fmt_bytes(extra)} of buffers as measured" if extra else "")
        ]
    name = dtype or m.frozen_dtype
    e = DTYPE_BYTES.get(name, ef0)
    if not n0:
        return f0, [f"{fmt_bytes(f0)} of buffers as measured"]
    if ef0 and buffers >= -0.001 * f0:
        extra = max(0.0, buffers)
        text = f"{_n(n0)} × {e} B ({name})" + (
            f" + {fmt_bytes(extra)} of buffers as measured" if extra else ""
        )
        return n0 * e + extra, [text]
    ratio = e / ef0 if ef0 else 1.0
    return f0 * ratio, [f"{fmt_bytes(f0)} measured" + (f" × {ratio:g} for {name}" if ratio != 1 else "")]


def _quantized(m: Measured, elements: float, dtype: str | None) -> tuple[float, str]:
    """``elements`` weights of ``m``'s model under QLoRA: its linear layers but the output
    one in 4-bit NF4, the rest (embeddings, norms, the output layer) in the compute dtype."""
    layers, how = base_layers(m)
    in_layers = min(elements, sum(a * b * k for (a, b), k in layers.items()))
    packed = effects.nf4_bytes(layers) * (in_layers / max(1, sum(a * b * k for (a, b), k in layers.items())))
    rest = elements - in_layers
    compute = qlora_compute_dtype(dtype)
    e = DTYPE_BYTES[compute]
    bits = effects.nf4_bits_per_element()
    text = (
        f"{sum(layers.values())} linear layers {how} in 4-bit NF4, {_n(in_layers)} × {bits:g} bits (n/2 packed "
        f"+ an fp32 absmax per {effects.NF4_BLOCK}: bitsandbytes without double quantization; "
        f"≈ {effects.nf4_bits_per_element(True):.2f} bits with it) = {fmt_bytes(packed)}"
    )
    if rest > 0:
        text += f", the other {_n(rest)} × {e} B ({compute}) = {fmt_bytes(rest * e)}"
    return packed + rest * e, text


def qlora_compute_dtype(dtype: str | None) -> str:
    """QLoRA's compute dtype: fp16 when asked, else bf16."""
    return dtype if dtype == "float16" else QLORA_COMPUTE_DTYPE


def adapted_layers(finetune: Mapping[str, Any], vocab: int | None = None) -> Layers:
    """``(out, in)`` → how many of the linear layers ``targets=auto`` adapts, from the
    capture's ``linear_shapes`` (the output layer left out); empty when none were recorded."""
    kept: Counter = Counter()
    for name, a, b, k in _recorded(finetune):
        if not _output(name, a, b, vocab):
            kept[(a, b)] += k
    return dict(kept)


def _recorded(finetune: Mapping[str, Any]) -> list[tuple[str, int, int, int]]:
    """The capture's ``linear_shapes`` rows (name, out, in, how many), those it can read."""
    out = []
    for row in finetune.get("linear_shapes") or []:
        try:
            name, a, b, k = row
            out.append((str(name), int(a), int(b), int(k)))
        except (TypeError, ValueError):
            continue
    return out


def _output(name: str, out: int, inp: int, vocab: int | None) -> bool:
    """Whether a linear layer is the model's output layer (the vocabulary wide)."""
    return name.rsplit(".", 1)[-1] in _OUTPUT_NAMES or (vocab is not None and vocab in (out, inp))


def _matches(name: str, names: Iterable[str]) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    return any(n in (leaf, name) or name.endswith("." + n) for n in names)


def _same(names: tuple[str, ...], recorded: object) -> bool:
    if isinstance(recorded, str):
        recorded = [recorded]
    return isinstance(recorded, (list, tuple)) and set(names) == {str(t) for t in recorded}


def _targets_text(recorded: object) -> str:
    if isinstance(recorded, (list, tuple)):
        return ", ".join(str(t) for t in recorded)
    return str(recorded) if recorded else "targets unknown"


def _width(m: Measured) -> tuple[int, str]:
    """The model width d, and what says so: the trace's, else the commonest side of its
    linear layers, else √(P / 12·L) (a transformer block holds ≈ 12·d²)."""
    if m.hidden:
        return m.hidden, f"= {m.hidden}, the model width from the trace"
    sides: Counter = Counter()
    for (a, b), k in m.matrices.items():
        sides[a] += k
        sides[b] += k
    if sides:
        d = sides.most_common(1)[0][0]
        return d, f"= {d}, the commonest side of the trace's linear layers"
    model = m.frozen_params if m.lora_rank is not None else m.params
    d = max(1, math.isqrt(max(1, model // (_BLOCK_PARAMS_PER_D2 * m.blocks))))
    return d, f"≈ √(P / {_BLOCK_PARAMS_PER_D2}·L) = {d}"
