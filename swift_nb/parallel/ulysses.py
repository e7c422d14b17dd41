"""Ulysses sequence parallelism: trade sequence shards for head shards, attend locally.

Each rank holds a contiguous slice of the sequence for all heads. One all-to-all turns that
into all of the sequence for ``heads/P`` heads, an ordinary ``scaled_dot_product_attention``
runs on it (any kernel the device has: flash, memory-efficient, math), and a second
all-to-all turns the output back into sequence shards. The backward pass runs the inverse
all-to-alls, so a forward and backward move 8 shards' worth of data per rank (q, k, v and
the output forward; their gradients backward), each all-to-all sending (P-1)/P of its
shard. Communication volume per rank does not grow with P, but P cannot exceed the number
of heads.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from swift_nb.parallel._comm import HeadsToSeq, SeqToHeads, check_qkv, resolve_group


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention over a sequence split across the ranks of ``group`` (default: all ranks).

    ``q``, ``k``, ``v``: this rank's shard ``[batch, heads, seq/P, head_dim]``; rank r holds
    tokens ``r*seq/P`` to ``(r+1)*seq/P - 1`` (see :func:`shard_sequence`). Every rank must
    pass the same shapes. ``causal``: token t attends to tokens ≤ t of the whole sequence.
    ``scale``: the softmax scale, ``1/sqrt(head_dim)`` by default.

    Returns this rank's shard of the output, ``[batch, heads, seq/P, head_dim]``, in the dtype
    of ``q``; differentiable with respect to ``q``, ``k`` and ``v``.
    """
    g = resolve_group(group, "ulysses_attention")
    check_qkv("ulysses_attention", q, k, v)
    heads = q.shape[1]
    if heads % g.size:
        raise ValueError(
            f"ulysses_attention: the number of heads ({heads}) must be divisible by the group size "
            f"({g.size}); use ring_attention or a group size that divides {heads}"
        )
    if g.size == 1:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    qh, kh, vh = SeqToHeads.apply(g, q, k, v)
    # The shards arrive in rank order, so the causal mask of the whole sequence is the plain one.
    out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal, scale=scale)
    return HeadsToSeq.apply(g, out)[0]
