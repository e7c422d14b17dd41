"""Ring attention: K/V blocks travel around the ranks, queries stay put.

Each rank keeps its query shard and, in P steps, sees every rank's K/V block: at each step it
posts the send of the block it holds to the next rank and the receive of the next block
from the previous rank, then attends to the block it holds while that transfer is in flight
(gloo moves it on its own threads, NCCL on its communication stream). Partial results are
merged with the log-sum-exp rule: with ``lse`` the running log of the softmax denominator,
``out = out * exp(lse - lse') + o_block * exp(lse_block - lse')`` where
``lse' = logaddexp(lse, lse_block)``.

Causal: shards are contiguous, so rank r attends to blocks of ranks < r in full, to its own
block with the causal mask, and skips the blocks of ranks > r: it computes r + 1 blocks and
receives r of them (rank P-1 sends nothing). The ranks are not load balanced: the last rank
computes P blocks, the first one, and the wall time is the last rank's. Balancing would need
a different layout (each rank holding one early and one late chunk), which the contiguous
shard contract of this module rules out.

Block attention is computed with explicit fp32 matmuls and ``logsumexp``. The fused SDPA
kernels return the log-sum-exp only through private, device-specific ATen ops, which this
device-agnostic code does not depend on. Scores are materialised one tile of
``chunk_size × chunk_size`` (per batch and head) at a time, so ``chunk_size`` bounds the score
memory; ``None`` uses the whole shard. A shard that is not a multiple of ``chunk_size`` ends in
a smaller chunk.

Backward: hand-written, a second ring pass in the style of ring-flash-attention. Forward
saves only q, k, v, the output and the fp32 log-sum-exp (4 bytes per query and head). The
backward pass sends K/V around the ring again and recomputes each tile's probabilities
from the saved log-sum-exp; the gradient of each K/V block (fp32) travels along with it,
each rank adding its share, and goes home at the end. Letting autograd record the forward
ring instead would keep every received K/V block (the whole sequence's K/V on every rank)
and every tile's probabilities (``T_local × seq`` per head) alive until backward, which is
the memory sequence parallelism exists to avoid; recomputing the forward under autograd
(checkpointing) saves that between forward and backward but holds it all again while
backward runs. The hand-written pass peaks at two K/V blocks (current and in flight), two or
three fp32 dK/dV blocks and one score tile's few temporaries, at the price of moving K/V once
more and dK/dV (fp32) once per step in backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from swift_nb.core.errors import ConfigError
from swift_nb.parallel._comm import Group, check_qkv, exchange, resolve_group, wait


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    causal: bool = False,
    scale: float | None = None,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Attention over a sequence split across the ranks of ``group`` (default: all ranks).

    ``q``, ``k``, ``v``: this rank's shard ``[batch, heads, seq/P, head_dim]``; rank r holds
    tokens ``r*seq/P`` to ``(r+1)*seq/P - 1`` (see :func:`shard_sequence`). Every rank must
    pass the same shapes. ``causal``: token t attends to tokens ≤ t of the whole sequence.
    ``scale``: the softmax scale, ``1/sqrt(head_dim)`` by default. ``chunk_size``: tokens per
    query and key tile, bounding the fp32 score memory to about
    ``batch × heads × chunk_size² × 4`` bytes per temporary; ``None`` for the whole shard.

    Returns this rank's shard of the output, ``[batch, heads, seq/P, head_dim]``, in the dtype
    of ``q``; differentiable with respect to ``q``, ``k`` and ``v``.
    """
    g = resolve_group(group, "ring_attention")
    check_qkv("ring_attention", q, k, v)
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise ConfigError(
            "chunk_size", "must be a positive number of tokens, or None for the whole shard", chunk_size
        )
    shard = q.shape[2]
    chunk = max(1, shard if chunk_size is None else min(chunk_size, shard))
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return _RingAttention.apply(q, k, v, g, bool(causal), scale, chunk)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group: Group, causal: bool, scale: float, chunk: int):
        p, r = group.size, group.rank
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:-1], -torch.inf, dtype=torch.float32, device=q.device)
        qf = q.float()
        kv = torch.stack([k, v])  # one message per step instead of two
        for step in range(r + 1 if causal else p):
            send, recv = _kv_moves(r, step, p, causal)
            incoming = torch.empty_like(kv) if recv else None
            reqs = exchange(
                group, [(kv, (r + 1) % p)] if send else [], [(incoming, (r - 1) % p)] if recv else []
            )
            _attend(qf, kv[0].float(), kv[1].float(), out, lse, scale, chunk, diagonal=causal and step == 0)
            wait(reqs)
            kv = incoming
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.scale, ctx.chunk = group, causal, scale, chunk
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, scale, chunk = ctx.group, ctx.causal, ctx.scale, ctx.chunk
        p, r = group.size, group.rank
        qf, do = q.float(), dout.float()
        delta = (do * out).sum(-1)  # rowsum(dO ∘ O): the softmax backward's correction term
        dq = torch.zeros_like(qf)
        kv = torch.stack([k, v])
        partial = None  # the held block's dK/dV summed over the ranks it visited before this one
        home = None  # this rank's own dK/dV, complete
        dkdv_reqs = []
        for step in range(p):
            send, recv = _kv_moves(r, step, p, causal)
            incoming = torch.empty_like(kv) if recv else None
            kv_reqs = exchange(
                group, [(kv, (r + 1) % p)] if send else [], [(incoming, (r - 1) % p)] if recv else []
            )
            dkdv = None
            if not causal or step <= r:
                dkdv = _attend_grad(
                    qf, do, kv[0].float(), kv[1].float(), lse, delta, dq, scale, chunk, causal and step == 0
                )
            wait(dkdv_reqs)
            sends = []
            if dkdv is not None:
                if step > 0:
                    dkdv += partial
                dest = _dkdv_dest(r, step, p, causal)
                if dest == r:
                    home = dkdv
                else:
                    sends.append((dkdv, dest))
            recvs = []
            for src, final in _dkdv_sources(r, step, p, causal):
                buf = torch.empty((2, *k.shape), dtype=torch.float32, device=k.device)
                recvs.append((buf, src))
                if final:
                    home = buf
                else:
                    partial = buf
            dkdv_reqs = exchange(group, sends, recvs)
            wait(kv_reqs)
            kv = incoming
        wait(dkdv_reqs)
        return (dq * scale).to(q.dtype), home[0].to(k.dtype), home[1].to(v.dtype), None, None, None, None


def _kv_moves(rank: int, step: int, size: int, causal: bool) -> tuple[bool, bool]:
    """Whether, during ``step``, this rank sends its K/V block to the next rank and receives
    the previous rank's. Causal: rank r needs blocks of ranks ≤ r only, so nothing wraps
    from the last rank to the first and a block stops where no later rank needs it."""
    if step >= size - 1:
        return False, False
    if not causal:
        return True, True
    return rank < size - 1 and step <= rank, step < rank


def _dkdv_dest(rank: int, step: int, size: int, causal: bool) -> int:
    """Where the dK/dV of the block held at ``step`` goes once this rank added its share: the
    next rank that attends to that block, or home (its owner) after the last one."""
    if not causal:
        return (rank + 1) % size
    return rank + 1 if rank < size - 1 else rank - step


def _dkdv_sources(rank: int, step: int, size: int, causal: bool) -> list[tuple[int, bool]]:
    """The dK/dV blocks this rank receives during ``step``: (source rank, whether it is this
    rank's own complete gradient rather than a partial sum it adds to at the next step)."""
    if size == 1:
        return []
    if not causal:
        return [((rank - 1) % size, step == size - 1)]
    sources = []
    if step < rank:
        sources.append((rank - 1, False))
    if rank < size - 1 and step == size - 1 - rank:
        sources.append((size - 1, True))
    return sources


def _tiles(length: int, chunk: int, diagonal: bool):
    """(query slice, key slice, causal mask or None) for every tile that is not fully masked.

    ``diagonal``: queries and keys are the same tokens, so a key tile after the query tile is
    skipped and the tile on the diagonal is masked above it."""
    for a in range(0, length, chunk):
        qs = slice(a, min(a + chunk, length))
        for b in range(0, qs.stop if diagonal else length, chunk):
            ks = slice(b, min(b + chunk, length))
            yield qs, ks, (b == a if diagonal else False)


def _scores(qa: torch.Tensor, kb: torch.Tensor, scale: float, masked: bool) -> torch.Tensor:
    """fp32 scores of one tile; ``masked``: a diagonal tile (queries and keys the same tokens,
    so it is square), where a key after its query gets -inf."""
    s = (qa @ kb.transpose(-1, -2)).mul_(scale)
    if masked:
        n = s.shape[-1]
        s.masked_fill_(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), -torch.inf)
    return s


def _attend(qf, kf, vf, out, lse, scale: float, chunk: int, diagonal: bool) -> None:
    """Merge attention of the fp32 queries to one K/V block into ``out`` and ``lse`` in place."""
    for qs, ks, masked in _tiles(qf.shape[2], chunk, diagonal):
        s = _scores(qf[:, :, qs], kf[:, :, ks], scale, masked)
        tile_lse = torch.logsumexp(s, dim=-1)
        o = s.sub_(tile_lse.unsqueeze(-1)).exp_() @ vf[:, :, ks]
        acc, acc_lse = out[:, :, qs], lse[:, :, qs]
        merged = torch.logaddexp(acc_lse, tile_lse)
        acc.mul_((acc_lse - merged).exp_().unsqueeze(-1)).add_(
            o.mul_((tile_lse - merged).exp_().unsqueeze(-1))
        )
        acc_lse.copy_(merged)


def _attend_grad(qf, do, kf, vf, lse, delta, dq, scale: float, chunk: int, diagonal: bool) -> torch.Tensor:
    """Add this block's share of dQ/scale to ``dq``; return its dK and dV as one fp32 tensor
    ``[2, batch, heads, block, head_dim]``."""
    dkdv = torch.zeros((2, *kf.shape), dtype=torch.float32, device=kf.device)
    dk, dv = dkdv[0], dkdv[1]
    for qs, ks, masked in _tiles(qf.shape[2], chunk, diagonal):
        qa, doa, kb = qf[:, :, qs], do[:, :, qs], kf[:, :, ks]
        # Masked scores are -inf, so their probabilities come out 0 without a second mask.
        prob = _scores(qa, kb, scale, masked).sub_(lse[:, :, qs].unsqueeze(-1)).exp_()
        dv[:, :, ks] += prob.transpose(-1, -2) @ doa
        ds = (doa @ vf[:, :, ks].transpose(-1, -2)).sub_(delta[:, :, qs].unsqueeze(-1)).mul_(prob)
        dq[:, :, qs] += ds @ kb
        dk[:, :, ks] += ds.transpose(-1, -2) @ qa
    dk.mul_(scale)  # dS/dK carries the softmax scale; dV does not
    return dkdv
