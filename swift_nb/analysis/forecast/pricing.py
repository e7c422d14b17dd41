"""The bytes of each memory category of a training step in another configuration: the
weights (parameters, frozen weights, gradients, optimizer state) exactly, from the parameter
counts, the bytes per element (or 4-bit packing), the optimizer's states, LoRA's adapters
(``finetune``) and the sharding; activations and other tensors by how they grow; then the
measured step's timeline scaled point by point for its peak.

A dtype other than the run's casts every category to it; the run's own leaves each as the
run had it (a LoRA run's bf16 base beside its fp32 adapters).
"""

from __future__ import annotations

import math

import numpy as np

from swift_nb.analysis import effects
from swift_nb.analysis.effects import ADAM_LIKE, OPTIMIZERS, Applied
from swift_nb.analysis.forecast import finetune
from swift_nb.analysis.forecast.finetune import Adapters
from swift_nb.analysis.forecast.growth import Growth
from swift_nb.analysis.forecast.measure import Measured
from swift_nb.analysis.forecast.result import Config, Peak
from swift_nb.core.errors import ConfigError
from swift_nb.core.units import MIN_8BIT_SIZE, fmt_bytes
from swift_nb.record import MEMORY_CATEGORIES
from swift_nb.vocabulary.forecast_spec import DTYPE_BYTES


def _n(x: float) -> str:
    return f"{x:,.0f}"


class CategoryPricer:
    """Prices a configuration in bytes of each memory category at its step's peak, from the
    measured run and how its activations and other tensors grow: ``peak(cfg)`` for the whole
    step, the other public methods for one category each, with the line that derives it."""

    def __init__(self, m: Measured, grow: dict[str, Growth]) -> None:
        self.m, self.grow = m, grow
        self._adapters_of: dict[effects.LoRA, Adapters] = {}

    # weights ------------------------------------------------------------------------

    def adapters(self, cfg: Config) -> Adapters | None:
        """The LoRA adapters ``cfg`` trains in place of the run's parameters (None: it trains
        what the run trained)."""
        lora = Applied(cfg.toggles).lora
        if lora is None:
            return None
        if lora not in self._adapters_of:  # the search for the largest batch asks again and again
            self._adapters_of[lora] = finetune.adapters(self.m, lora)
        return self._adapters_of[lora]

    def _trainable(self, cfg: Config) -> tuple[float, float, str]:
        """(elements, bytes before sharding, what they are) of the parameters ``cfg`` trains."""
        m = self.m
        e = DTYPE_BYTES[cfg.dtype]
        ad = self.adapters(cfg)
        if ad is not None:
            return ad.elements, ad.elements * e, ad.how
        what = f"the run's LoRA r={m.lora_rank} adapters, " if m.lora_rank is not None else ""
        return m.params, m.categories["parameters"] * e / m.element_bytes, what

    def parameters(self, cfg: Config) -> tuple[float, str]:
        m = self.m
        e = DTYPE_BYTES[cfg.dtype]
        shard = cfg.shards[0]
        count, full, what = self._trainable(cfg)
        value = full / shard
        if self.adapters(cfg) is not None:
            line = f"parameters: {what} × {e} B ({cfg.dtype})"
        else:
            line = f"parameters: {what}{_n(count)} × {e} B ({cfg.dtype})"
            if e != m.element_bytes:
                line += f", measured {fmt_bytes(m.categories['parameters'])} at {m.element_bytes} B each"
        return value, line + _shard_text(shard, "parameters") + f" = {fmt_bytes(value)}"

    def frozen(self, cfg: Config) -> tuple[float, str]:
        """The frozen weights: the run's own at the configuration's dtype (or 4-bit under a
        new QLoRA), and under new LoRA adapters the model's weights the run trained."""
        m = self.m
        shard = cfg.shards[0]
        lora = Applied(cfg.toggles).lora
        value, parts = finetune.frozen_weights(m, lora, cfg.dtype if cfg.dtype != m.dtype else None)
        value /= shard
        line = "frozen weights: " + (
            " + ".join(parts) or "none (every parameter of the cell's models trains)"
        )
        return value, line + _shard_text(shard, "frozen weights") + f" = {fmt_bytes(value)}"

    def gradients(self, cfg: Config) -> tuple[float, float, str]:
        """(at the measured peak's share, all of them, line) in bytes."""
        m = self.m
        e = DTYPE_BYTES[cfg.dtype]
        shard = cfg.shards[1]
        count, full, _ = self._trainable(cfg)
        full /= shard
        share = (
            min(1.0, m.categories["gradients"] / m.categories["parameters"])
            if m.categories["parameters"]
            else 0
        )
        if share >= 0.999:
            line = f"gradients: all {_n(count)} × {e} B"
        else:
            line = (
                f"gradients: {share:.0%} of the {_n(count)} were alive at the measured peak (backward frees "
                f"activations as it makes gradients) × {e} B"
            )
        return share * full, full, line + _shard_text(shard, "gradients") + f" = {fmt_bytes(share * full)}"

    def optimizer_state(self, cfg: Config) -> tuple[float, str]:
        m = self.m
        name = cfg.optimizer or m.optimizer
        shard = cfg.shards[2]
        e = DTYPE_BYTES[cfg.dtype]
        measured = m.categories["optimizer_state"]
        run_states = self._run_states()
        extra = max(0.0, measured - run_states * m.params * self._state_bytes(m.optimizer, m.element_bytes))
        rank = Applied(cfg.toggles).galore_rank
        ad = self.adapters(cfg)
        if Applied(cfg.toggles, m.toggles).optim_8bit:
            value, text = self._adam8bit(ad, extra)
            return value / shard, text + _shard_text(
                shard, "optimizer state"
            ) + f" = {fmt_bytes(value / shard)}"
        if rank is not None:
            elems, text = self._galore(rank)
        elif ad is not None and ad.elements != m.params:
            if name not in OPTIMIZERS:  # unknown: the run's bytes per trainable parameter
                value = measured * ad.elements / m.params * e / m.element_bytes / shard if m.params else 0.0
                text = (
                    f"optimizer state: {name or 'the run’s optimizer'} as measured per trainable parameter, "
                    f"{fmt_bytes(measured)} × {_n(ad.elements)}/{_n(m.params)}"
                )
                return value, text + _shard_text(shard, "optimizer state") + f" = {fmt_bytes(value)}"
            elems, text = self._elements(name, ad)
        elif name == m.optimizer or name is None:
            ratio = self._state_bytes(name, e) / self._state_bytes(name, m.element_bytes)
            value = measured * ratio / shard
            text = f"optimizer state: {name or 'the run’s optimizer'} as measured, {fmt_bytes(measured)}"
            if name in OPTIMIZERS and m.params:
                per = self._state_bytes(name, m.element_bytes)
                text += (
                    f" ({run_states:g} × {_n(m.params)} × {per} B"
                    + (f" + {_n(extra)} B" if extra else "")
                    + ")"
                )
            if ratio != 1:
                text += f" × {ratio:g} for {cfg.dtype} state"
            return value, text + _shard_text(shard, "optimizer state") + f" = {fmt_bytes(value)}"
        else:
            elems, text = self._elements(name)
        per = self._state_bytes(name, e)
        value = (elems * per + extra) / shard
        text += f" × {per} B"
        if extra:
            text += f" + {fmt_bytes(extra)} of step counters and the like as measured"
        return value, text + _shard_text(shard, "optimizer state") + f" = {fmt_bytes(value)}"

    def _update(self, cfg: Config, state: float) -> tuple[float, list[str]]:
        """What the optimizer's update holds beyond its state while it runs, as the target's
        implementation runs it: measured apart (``Measured.update_bytes``), as much more as
        the state is; for bitsandbytes' 8-bit optimizer ``effects.adam8bit_update``."""
        m = self.m
        if Applied(cfg.toggles, m.toggles).optim_8bit:
            value, text = effects.adam8bit_update(m.params_largest, cfg.cuda)
            return value, [f"the update (other, at its moment): {text}"]
        if not m.update_bytes:
            return 0.0, []
        measured = m.categories["optimizer_state"]
        value = m.update_bytes * (state / measured if measured else 1.0)
        return value, [
            f"the update (other, at its moment): {fmt_bytes(m.update_bytes)} measured beyond the state while "
            f"{m.optimizer} updates (foreach), × the state's {fmt_bytes(state)}/{fmt_bytes(measured)} "
            f"= {fmt_bytes(value)}"
        ]

    def _adam8bit(self, ad: Adapters | None, extra: float) -> tuple[float, str]:
        """AdamW8bit's state (``effects.adam8bit_state``) for the parameters the configuration
        trains: 8-bit moments for tensors of ≥ 4 096 elements, fp32 for smaller ones."""
        m = self.m
        if (m.optimizer or "AdamW") not in ("Adam", "AdamW"):
            raise ConfigError(
                "toggles",
                f"optim_8bit replaces Adam/AdamW; this run's optimizer is {m.optimizer}",
                m.optimizer,
            )
        if ad is not None and ad.matrices:
            sizes = [float(a * b) for (a, b), k in ad.matrices.items() for _ in range(k)]
            large = [n for n in sizes if n >= MIN_8BIT_SIZE]
            small = ad.elements - sum(large)
            how = "the adapters' A and B"
        else:
            small, how = self._small_params()
            large = [max(0.0, m.params - small)]
        value = effects.adam8bit_state(large, small) + extra
        text = (
            f"optimizer state: AdamW8bit (bitsandbytes) on {how}: 2 × {_n(sum(large))} × 1 B + an fp32 absmax per "
            f"256 elements, and 2 × {_n(small)} × 4 B for tensors of < {MIN_8BIT_SIZE:,} elements"
        )
        if extra:
            text += f" + {fmt_bytes(extra)} of step counters and the like as measured"
        return value, text

    def _small_params(self) -> tuple[float, str]:
        """Elements in tensors too small for 8-bit state, and where the count comes from: the
        run's record, else what its linear layers and embedding (from the trace) leave."""
        m = self.m
        if m.params_small is not None:
            return float(m.params_small), "the run's parameters (their sizes as recorded)"
        shapes = sum(a * b * k for (a, b), k in m.matrices.items())
        embedding = (m.vocab or 0) * (m.hidden or 0)
        small = max(0.0, m.params - shapes - embedding) if shapes else 0.0
        return (
            small,
            "the run's parameters (the linear and embedding weights from the trace; the rest taken as small)",
        )

    def _run_states(self) -> float:
        """States per parameter of the run's optimizer: SGD's measured (momentum or not),
        others' from the table."""
        m = self.m
        state = OPTIMIZERS.get(m.optimizer or "")
        if state is None or (m.optimizer == "SGD" and m.params):
            per = self._state_bytes(m.optimizer, m.element_bytes)
            return float(round(m.categories["optimizer_state"] / (m.params * per))) if m.params else 0.0
        return float(state.states)

    def _state_bytes(self, name: str | None, element_bytes: int) -> int:
        state = OPTIMIZERS.get(name or "")
        return state.element_bytes if state and state.element_bytes else element_bytes

    def _elements(self, name: str, ad: Adapters | None = None) -> tuple[float, str]:
        """Elements of ``name``'s state for the run's parameters, or for adapters ``ad``."""
        state = OPTIMIZERS.get(name)
        if state is None:
            raise ConfigError("optimizer", f"must be one of {', '.join(OPTIMIZERS)}", name)
        m = self.m
        params = ad.elements if ad is not None else m.params
        if state.factored:
            if ad is not None and ad.matrices:
                shapes, how = ad.matrices, "(the adapters' A and B)"
            else:
                shapes, how = self._shapes()
            in_matrices = sum(a * b * k for (a, b), k in shapes.items())
            elems = sum((a + b) * k for (a, b), k in shapes.items()) + max(0, params - in_matrices)
            return elems, (
                f"optimizer state: Adafactor's row and column second moments of the weight matrices {how} "
                f"(m + n each) and one per other parameter: {_n(elems)} elements"
            )
        states = self._run_states() if name == m.optimizer else state.states
        which = "trainable parameter (the adapters)" if ad is not None else "parameter"
        return (
            states * params,
            f"optimizer state: {name} keeps {states:g} per {which}: {states:g} × {_n(params)}",
        )

    def _shapes(self) -> tuple[dict[tuple[int, int], int], str]:
        """The weight matrices, and where they come from: the trace's linear layers, else
        square d×d matrices holding every parameter (d the width when known, else √P)."""
        m = self.m
        shapes = m.matrices
        if shapes and sum(a * b * k for (a, b), k in shapes.items()) <= m.params * 1.001:
            return shapes, f"({sum(shapes.values())} linear layers' weights, shapes from the trace)"
        d = m.hidden or max(1, math.isqrt(m.params))
        k = max(1, m.params // (d * d))
        source = "the model width from the trace" if m.hidden else "√(parameter count)"
        return {
            (d, d): k
        }, f"(assumed: {k} square {d}×{d} matrices, {source}; the trace has no linear shapes)"

    def _galore(self, rank: int) -> tuple[float, str]:
        """GaLore AdamW's moments: for an m×n weight with both sides above the rank (m ≤ n),
        2·r·n + m·r (two r×n moments and the m×r projection) instead of 2·m·n; every other
        parameter keeps Adam's two."""
        m = self.m
        if (m.optimizer or "Adam") not in ADAM_LIKE:
            raise ConfigError(
                "toggles",
                f"galore replaces Adam/AdamW; this run's optimizer is {m.optimizer}",
                m.optimizer,
            )
        shapes, how = self._shapes()
        g = effects.galore_state(shapes, m.params, rank)
        return g.elements, (
            f"optimizer state: GaLore rank {rank} on {g.projected} weight matrices {how}: "
            f"Σ (2·r·n + m·r) = {_n(g.low_rank)} elements instead of 2·m·n = {_n(2 * g.projected_params)}, "
            f"+ 2 × {_n(m.params - g.projected_params)} other parameters = {_n(g.elements)} elements"
        )

    # activations and other -----------------------------------------------------------

    def variable(self, cat: str, cfg: Config) -> tuple[np.ndarray, float, str]:
        """How ``cat`` (activations or other) scales for ``cfg``: factors for its three parts
        (the rest, [.., T, T] tensors per sample, batch-free ones), its bytes at the measured
        peak's point, and the derivation."""
        g, m = self.grow[cat], self.m
        b0, t0 = m.shape
        b, t = cfg.batch_size, (cfg.seq_len if m.seq_len else 1)
        flash = Applied(cfg.toggles).fused_attention
        per_sample, batch_free = m.scores.of(cat)
        rest = max(0.0, m.categories[cat] - per_sample - batch_free)
        constant, tokens, scores, masks = g.parts(b, t)
        terms = []
        if g.constant:
            terms.append(f"{fmt_bytes(g.constant)} constant")
        tokens_text = f" × ({t:,}/{t0:,}) tokens" if m.seq_len else ""
        samples = f"{b:,} sample" + ("s" if b != 1 else "")
        terms.append(f"{fmt_bytes(g.per_token * t0)}/sample × {samples}{tokens_text}")
        if per_sample + batch_free:
            new_rest = constant + tokens
            factors = [0.0, 0.0] if flash else [(b / b0) * (t / t0) ** 2, (t / t0) ** 2]
            if flash:
                terms.append(f"no [.., T, T] tensors ({fmt_bytes(per_sample + batch_free)} measured)")
            else:
                terms.append(
                    f"{fmt_bytes(per_sample / b0)}/sample of [B, H, T, T] tensors × {samples} × ({t:,}/{t0:,})²"
                )
                if batch_free:
                    terms.append(f"{fmt_bytes(batch_free)} of [T, T] masks × ({t:,}/{t0:,})²")
        else:  # no score tensors seen: a fitted B·T² part is theirs
            new_rest = constant + tokens + (0.0 if flash else scores + masks)
            factors = [0.0, 0.0]
            if g.per_score and not flash:
                terms.append(f"{fmt_bytes(g.per_score * t0 * t0)}/sample × {samples} × ({t:,}/{t0:,})²")
            elif g.per_score:
                terms.append("no part quadratic in T (fused attention)")
        scale = np.array([new_rest / rest if rest else 0.0, *factors])
        mult, more = self._multiplier(cfg)
        value = float(np.dot([rest, per_sample, batch_free], scale)) * mult
        if cat == "activations":
            added, text = self._adapter_activations(cfg)
            if added and value:
                mult *= (value + added) / value
                value += added
                more += text
        shape = f"batch {b0}" + (f" × {t0:,} tokens" if m.seq_len else "")
        line = f"{cat}: {fmt_bytes(m.categories[cat])} measured at {shape} ({g.how}) → " + " + ".join(terms)
        return scale * mult, value, line + more + f" = {fmt_bytes(value)}"

    def _adapter_activations(self, cfg: Config) -> tuple[float, str]:
        """What new LoRA adapters keep for backward (``effects.lora_activations``), and the text."""
        ad = self.adapters(cfg)
        if ad is None or not ad.new or not ad.layers:
            return 0.0, ""
        m = self.m
        _, e = self._compute(cfg)
        t = cfg.seq_len if m.seq_len else 1
        sp = Applied(cfg.toggles).sp_size
        inputs = ad.inputs if ad.lora.dropout else 0
        added = effects.lora_activations(cfg.batch_size * t / sp, ad.lora.rank, ad.layers, e, inputs)
        text = f"; + the adapters' own, x·A kept for B's gradient: B·T × r={ad.lora.rank} × {ad.layers} layers × {e} B"
        if inputs:
            text += f", and dropout's output and mask: B·T × {_n(inputs)} inputs × ({e} + 1) B"
        if sp > 1:
            text += f" ÷ {sp}"
        return added, text + (
            f" = {fmt_bytes(added)} (approximate: the frozen base is taken to keep what the full fine-tune kept, "
            "though a frozen layer no longer keeps its input for its weight's gradient: expect somewhat less)"
        )

    def _compute(self, cfg: Config) -> tuple[str, int]:
        """The dtype the configuration's activations are in, and its bytes: a new QLoRA base
        computes in bf16; a dtype other than the run's casts them; else the run's."""
        m = self.m
        lora = Applied(cfg.toggles).lora
        if lora is not None and lora.quantized and not m.quantization:
            name = finetune.qlora_compute_dtype(cfg.dtype if cfg.dtype != m.dtype else None)
        else:
            name = cfg.dtype if cfg.dtype != m.dtype else m.compute_dtype
        return name, DTYPE_BYTES[name]

    def _multiplier(self, cfg: Config) -> tuple[float, str]:
        """What dtype, autocast and sequence parallelism multiply activations and other by."""
        m = self.m
        text, mult = "", 1.0
        name, e = self._compute(cfg)
        ratio = e / DTYPE_BYTES[m.compute_dtype]
        if ratio != 1:
            mult *= ratio
            text += f"; × {ratio:g} for {name} tensors"
        applied = Applied(cfg.toggles, m.toggles)
        if applied.new_autocast and cfg.dtype == "float32":
            mult = effects.autocast_activations(mult)
            text += (
                f"; × {effects.AUTOCAST_ACTIVATIONS:g} under bf16 autocast (matmul outputs in bf16; norms, softmax and "
                "the residual stream stay fp32)"
            )
        if applied.sp_size > 1:
            mult = effects.sequence_parallel_activations(mult, applied.sp_size)
            text += f"; ÷ {applied.sp_size} ranks of sequence parallelism"
        return mult, text

    # the step ------------------------------------------------------------------------

    def peak(self, cfg: Config) -> Peak:
        """The forecast step's peak: every point of the measured timeline scaled, the
        largest sum taken (the peak's own row first)."""
        m = self.m
        params, p_line = self.parameters(cfg)
        frozen, f_line = self.frozen(cfg)
        _, grads_full, g_line = self.gradients(cfg)
        state, o_line = self.optimizer_state(cfg)
        act_scale, act, a_line = self.variable("activations", cfg)
        other_scale, _, x_line = self.variable("other", cfg)
        ckpt, recomputed, a_line = self._checkpointing(act, a_line, cfg)
        ckpt, a_line = self._offloaded(ckpt, a_line, cfg)
        other_extra, extra_lines = self._extras(cfg, params, frozen, grads_full)
        other_extra += recomputed
        measured_params = m.categories["parameters"] or 1.0
        measured_frozen, measured_state = m.categories["frozen_parameters"], m.categories["optimizer_state"]
        weights = [params / measured_params, frozen / measured_frozen if measured_frozen else 0.0]
        weights += [grads_full / measured_params, state / measured_state if measured_state else 0.0]
        logits_scale, l_line = self.logits(cfg)
        pack, mask, pack_lines = self._packing(cfg)
        fused = Applied(cfg.toggles, m.toggles).fused_ce  # its logits are the real tokens' already
        logits_scale *= 1.0 if fused else pack[0]
        parts = m.timeline * np.concatenate(
            [weights, act_scale * ckpt * pack, other_scale * pack, [logits_scale]]
        )
        cats = np.column_stack([parts[:, :4], parts[:, 4:7].sum(1), parts[:, 10], parts[:, 7:10].sum(1)])
        col = {c: i for i, c in enumerate(MEMORY_CATEGORIES)}
        # what the run did not have: frozen weights (a full fine-tune under LoRA), optimizer state
        cats[:, col["frozen_parameters"]] += 0.0 if measured_frozen else frozen
        cats[:, col["optimizer_state"]] += 0.0 if measured_state else state
        cats[:, col["other"]] += other_extra + mask
        update, u_line = self._update(cfg, state)
        cats[-1, col["other"]] += update
        at = int(np.argmax(cats.sum(axis=1)))
        lines = [p_line, f_line, g_line, o_line, a_line, *([l_line] if l_line else []), x_line]
        lines += [*pack_lines, *extra_lines, *u_line]
        if at:
            lines.append(
                "peak: the forecast step peaks elsewhere than the measured one, at the point of the measured "
                "step where the scaled categories add up to most ("
                + ", ".join(
                    f"{c.replace('_', ' ')} {fmt_bytes(v)}"
                    for c, v in zip(MEMORY_CATEGORIES, cats[at], strict=True)
                )
                + ")"
            )
        return Peak(dict(zip(MEMORY_CATEGORIES, cats[at].tolist(), strict=True)), lines)

    def _packing(self, cfg: Config) -> tuple[np.ndarray, float, list[str]]:
        """Under packing: factors for the three parts of activations and other (the rest,
        [B, H, T, T] tensors, [T, T] ones), the bytes of its mask where the measured run
        had none to scale, and the derivation. The real tokens computed, N = B·T·share, are
        one row: what grows with the tokens × share, the [.., T, T] tensors (eager's
        scores, sdpa's math path, masks) become [.., N, N] ones, from B·T² to N². Off
        FlashAttention's variable-length kernel the toggle builds an N × N additive mask
        (``effects.packing_mask``)."""
        m = self.m
        if not (Applied(cfg.toggles, m.toggles).packing and m.real_share < 1.0):
            return np.ones(3), 0.0, []
        share, b = m.real_share, cfg.batch_size
        t = cfg.seq_len if m.seq_len else 1
        n = b * t * share
        factors = np.array([share, share * b * share, share * b * b * share])
        lines = [
            f"packing: {n:,.0f} real tokens in one row ({share:.3f} of {b:,} × {t:,}): activations, other "
            f"tensors and logits × {share:.3f}; [B, H, T, T] tensors × {b * share:.3f} more and [T, T] ones "
            f"× {b * b * share:.3f} more (B·T² → N²)"
        ]
        mask = 0.0
        varlen = cfg.cuda and (Applied(cfg.toggles).fused_attention or m.attn_varlen)
        measured_masks = sum(m.scores.of("other"))
        if not varlen and not measured_masks:
            mask = effects.packing_mask(n, DTYPE_BYTES[cfg.dtype])
            lines.append(
                f"packing's block-diagonal mask: {n:,.0f}² × {DTYPE_BYTES[cfg.dtype]} B = {fmt_bytes(mask)} "
                "(other), while forward runs"
            )
        return factors, mask, lines

    def logits(self, cfg: Config) -> tuple[float, str]:
        """How the loss's logits scale for ``cfg``: with the tokens (B·T ÷ the ranks of
        sequence parallelism), in the dtype the loss upcasts them to whatever the model's;
        and the line that says so ("" when the run measured none)."""
        m = self.m
        measured = m.categories.get("logits", 0.0)
        if not measured:
            return 0.0, ""
        b0, t0 = m.shape
        b, t = cfg.batch_size, (cfg.seq_len if m.seq_len else t0)
        sp = Applied(cfg.toggles).sp_size
        scale = (b * t) / (b0 * t0) / max(1, sp)
        if Applied(cfg.toggles, m.toggles).fused_ce and m.vocab:
            real = b * t * m.real_share / max(1, sp)
            fused = effects.fused_ce_logits(real, m.vocab, m.hidden, cfg.cuda)
            how = (
                "one chunk and its gradient (Liger, CUDA)"
                if cfg.cuda and m.hidden
                else "one fp32 copy of the real tokens' (cut-cross-entropy, CPU)"
            )
            return fused / measured, (
                f"logits under fused_ce: {how}: {real:,.0f} real tokens × {m.vocab:,} = {fmt_bytes(fused)} "
                f"instead of {fmt_bytes(measured * scale)}"
            )
        text = f"logits: {fmt_bytes(measured)} measured × ({b:,}×{t:,})/({b0:,}×{t0:,}) tokens"
        if sp > 1:
            text += f" ÷ {sp} ranks of sequence parallelism"
        return scale, f"{text} = {fmt_bytes(measured * scale)}"

    def _checkpointing(self, act: float, line: str, cfg: Config) -> tuple[float, float, str]:
        """Under gradient checkpointing: the factor activations are multiplied by, the bytes
        of the block backward recomputes (made after backward began, so counted as other),
        and the line."""
        m = self.m
        applied = Applied(cfg.toggles, m.toggles)
        every = applied.checkpoint_every
        if every is None or not act:
            return 1.0, 0.0, line
        blocks = m.blocks
        checkpointed = effects.every_nth(blocks, every)
        ckpt = effects.checkpointing(act, blocks, checkpointed)
        recomputed, kept = ckpt.recomputed, ckpt.kept
        text = (
            f"; {checkpointed} of {blocks} blocks ({m.blocks_from}) checkpointed keep A − A·{checkpointed}/{blocks}"
            f" = {fmt_bytes(kept)}"
        )
        if m.hidden:
            e = 2 if applied.autocast else self._compute(cfg)[1]
            t = cfg.seq_len if m.seq_len else 1
            boundary = checkpointed * cfg.batch_size * t * m.hidden * e / applied.sp_size
            kept += boundary
            text += f" + their inputs ({checkpointed} × B·T·{m.hidden} × {e} B = {fmt_bytes(boundary)})"
        text += (
            f"; backward recomputes one block at a time, its A/{blocks} = {fmt_bytes(recomputed)} alive again "
            "(counted as other: made after backward began)"
        )
        return kept / act, recomputed, line + text + f" → {fmt_bytes(kept)}"

    def _offloaded(self, factor: float, line: str, cfg: Config) -> tuple[float, str]:
        """Under activation_offload: the saved tensors wait in host memory, and the device
        holds those of the block computing (one of the repeated blocks' share) while forward
        makes them and backward brings them back."""
        m = self.m
        if not Applied(cfg.toggles, m.toggles).activation_offload:
            return factor, line
        blocks = max(1, m.blocks)
        return factor / blocks, line + (
            f"; offloaded to pinned host memory, the device keeps one block's in flight: ÷ {blocks} blocks "
            f"({m.blocks_from or 'none found: all kept'})"
        )

    def _extras(
        self, cfg: Config, params: float, frozen: float, grads_full: float
    ) -> tuple[float, list[str]]:
        """Tensors the configuration adds that the run did not have (counted as other)."""
        m = self.m
        lines, extra = [], 0.0
        if m.untracked_bytes:
            extra += m.untracked_bytes
            lines.append(
                f"untracked: the measured peak held {fmt_bytes(m.untracked_bytes)} more than its categories (tensors "
                "made before the recording began: buffers, caches, the batch), kept as measured"
            )
        if Applied(cfg.toggles, m.toggles).new_autocast and cfg.dtype == "float32":
            copies = effects.autocast_weight_copies(params * cfg.shards[0])
            extra += copies
            lines.append(
                f"bf16 autocast: bf16 copies of the weights that matmuls keep for backward, P × 2 B = {fmt_bytes(copies)}"
            )
        lora = Applied(cfg.toggles).lora
        if lora is not None and lora.quantized and not m.quantization:
            copy, shape = finetune.dequantized_copy(m, cfg.dtype if cfg.dtype != m.dtype else None)
            extra += copy
            lines.append(
                f"QLoRA: each 4-bit layer dequantizes its weight for the matmul (in forward, again in backward), one "
                f"at a time: the largest, {shape} = {fmt_bytes(copy)}"
            )
        p_shard, g_shard, _ = cfg.shards
        if cfg.world_size > 1 and g_shard == 1 and m.world_size == 1:
            extra += grads_full
            lines.append(
                f"DDP over {cfg.world_size} ranks: its gradient buckets hold one more copy of the gradients, "
                f"{fmt_bytes(grads_full)} (none with gradient_as_bucket_view=True)"
            )
        if p_shard > 1:
            blocks = max(1, m.blocks)
            gathered = 2 * (params + frozen) * p_shard / blocks
            extra += gathered
            lines.append(
                f"sharded parameters: two blocks' worth gathered at a time (the current and the prefetched), "
                f"2 × P/{blocks} = {fmt_bytes(gathered)}" + (" (frozen weights included)" if frozen else "")
            )
        return extra, lines


def _shard_text(shard: int, what: str) -> str:
    return f" ÷ {shard} ranks ({what} sharded)" if shard > 1 else ""
