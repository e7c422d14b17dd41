"""The bytes of each memory category of a training step in another configuration: the
weights (parameters, gradients, optimizer state) exactly, from the parameter count, the
bytes per element, the optimizer's states and the sharding; activations and other tensors
by how they grow; then the measured step's timeline scaled point by point for its peak.
"""

from __future__ import annotations

import math

import numpy as np

from swift_nb.analysis import effects
from swift_nb.analysis.effects import ADAM_LIKE, OPTIMIZERS, Applied
from swift_nb.analysis.forecast.growth import Growth
from swift_nb.analysis.forecast.measure import Measured
from swift_nb.analysis.forecast.result import Config, Peak
from swift_nb.analysis.forecast.spec import DTYPE_BYTES
from swift_nb.errors import ConfigError
from swift_nb.record import MEMORY_CATEGORIES
from swift_nb.units import fmt_bytes


def _n(x: float) -> str:
    return f"{x:,.0f}"


class CategoryPricer:
    """Prices a configuration in bytes of each memory category at its step's peak, from the
    measured run and how its activations and other tensors grow: ``peak(cfg)`` for the whole
    step, the other public methods for one category each, with the line that derives it."""

    def __init__(self, m: Measured, grow: dict[str, Growth]) -> None:
        self.m, self.grow = m, grow

    # weights ------------------------------------------------------------------------

    def parameters(self, cfg: Config) -> tuple[float, str]:
        m = self.m
        e = DTYPE_BYTES[cfg.dtype]
        shard = cfg.shards[0]
        value = m.categories["parameters"] * e / m.element_bytes / shard
        line = f"parameters: {_n(m.params)} × {e} B ({cfg.dtype})"
        if e != m.element_bytes:
            line += f", measured {fmt_bytes(m.categories['parameters'])} at {m.element_bytes} B each"
        return value, line + _shard_text(shard, "parameters") + f" = {fmt_bytes(value)}"

    def gradients(self, cfg: Config) -> tuple[float, float, str]:
        """(at the measured peak's share, all of them, line) in bytes."""
        m = self.m
        e = DTYPE_BYTES[cfg.dtype]
        shard = cfg.shards[1]
        full = m.categories["parameters"] * e / m.element_bytes / shard
        share = (
            min(1.0, m.categories["gradients"] / m.categories["parameters"])
            if m.categories["parameters"]
            else 0
        )
        if share >= 0.999:
            line = f"gradients: all {_n(m.params)} × {e} B"
        else:
            line = (
                f"gradients: {share:.0%} of the {_n(m.params)} were alive at the measured peak (backward frees "
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
        if rank is not None:
            elems, text = self._galore(rank)
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

    def _elements(self, name: str) -> tuple[float, str]:
        state = OPTIMIZERS.get(name)
        if state is None:
            raise ConfigError("optimizer", f"must be one of {', '.join(OPTIMIZERS)}", name)
        m = self.m
        if state.factored:
            shapes, how = self._shapes()
            in_matrices = sum(a * b * k for (a, b), k in shapes.items())
            elems = sum((a + b) * k for (a, b), k in shapes.items()) + max(0, m.params - in_matrices)
            return elems, (
                f"optimizer state: Adafactor's row and column second moments of the weight matrices {how} "
                f"(m + n each) and one per other parameter: {_n(elems)} elements"
            )
        states = self._run_states() if name == m.optimizer else state.states
        return (
            states * m.params,
            f"optimizer state: {name} keeps {states:g} per parameter: {states:g} × {_n(m.params)}",
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
        shape = f"batch {b0}" + (f" × {t0:,} tokens" if m.seq_len else "")
        line = f"{cat}: {fmt_bytes(m.categories[cat])} measured at {shape} ({g.how}) → " + " + ".join(terms)
        return scale * mult, value, line + more + f" = {fmt_bytes(value)}"

    def _multiplier(self, cfg: Config) -> tuple[float, str]:
        """What dtype, autocast and sequence parallelism multiply activations and other by."""
        m = self.m
        text, mult = "", 1.0
        ratio = DTYPE_BYTES[cfg.dtype] / m.element_bytes
        if ratio != 1:
            mult *= ratio
            text += f"; × {ratio:g} for {cfg.dtype} tensors"
        applied = Applied(cfg.toggles, m.toggles)
        if applied.new_autocast and cfg.dtype == "float32":
            mult = effects.autocast_activations(mult)
            text += (
                "; × ½ under bf16 autocast (it keeps softmax and norms in fp32 on some devices: expect more)"
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
        _, grads_full, g_line = self.gradients(cfg)
        state, o_line = self.optimizer_state(cfg)
        act_scale, act, a_line = self.variable("activations", cfg)
        other_scale, _, x_line = self.variable("other", cfg)
        ckpt, recomputed, a_line = self._checkpointing(act, a_line, cfg)
        other_extra, extra_lines = self._extras(cfg, params, grads_full)
        other_extra += recomputed
        measured_params = m.categories["parameters"] or 1.0
        weights = [params / measured_params, grads_full / measured_params]
        weights.append(state / m.categories["optimizer_state"] if m.categories["optimizer_state"] else 0.0)
        parts = m.timeline * np.concatenate([weights, act_scale * ckpt, other_scale])
        cats = np.column_stack(
            [parts[:, 0], parts[:, 1], parts[:, 2], parts[:, 3:6].sum(1), parts[:, 6:9].sum(1)]
        )
        cats[:, 2] += 0.0 if m.categories["optimizer_state"] else state  # state the run did not have
        cats[:, 4] += other_extra
        at = int(np.argmax(cats.sum(axis=1)))
        lines = [p_line, g_line, o_line, a_line, x_line, *extra_lines]
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
            e = 2 if applied.autocast else DTYPE_BYTES[cfg.dtype]
            t = cfg.seq_len if m.seq_len else 1
            boundary = checkpointed * cfg.batch_size * t * m.hidden * e / applied.sp_size
            kept += boundary
            text += f" + their inputs ({checkpointed} × B·T·{m.hidden} × {e} B = {fmt_bytes(boundary)})"
        text += (
            f"; backward recomputes one block at a time, its A/{blocks} = {fmt_bytes(recomputed)} alive again "
            "(counted as other: made after backward began)"
        )
        return kept / act, recomputed, line + text + f" → {fmt_bytes(kept)}"

    def _extras(self, cfg: Config, params: float, grads_full: float) -> tuple[float, list[str]]:
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
        p_shard, g_shard, _ = cfg.shards
        if cfg.world_size > 1 and g_shard == 1 and m.world_size == 1:
            extra += grads_full
            lines.append(
                f"DDP over {cfg.world_size} ranks: its gradient buckets hold one more copy of the gradients, "
                f"{fmt_bytes(grads_full)} (none with gradient_as_bucket_view=True)"
            )
        if p_shard > 1:
            blocks = max(1, m.blocks)
            gathered = 2 * params * p_shard / blocks
            extra += gathered
            lines.append(
                f"sharded parameters: two blocks' worth gathered at a time (the current and the prefetched), "
                f"2 × P/{blocks} = {fmt_bytes(gathered)}"
            )
        return extra, lines


def _shard_text(shard: int, what: str) -> str:
    return f" ÷ {shard} ranks ({what} sharded)" if shard > 1 else ""
