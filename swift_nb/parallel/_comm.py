"""Checks and communication shared by the sequence-parallel attentions.

Every check here uses only what this rank knows (its own tensors and its own view of the
process group), so a bad call raises the same error on every rank before any rank enters a
collective: nobody is left waiting for a peer that gave up.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

NOT_INITIALISED = (
    "torch.distributed is not initialised: call dist.init_process_group(...) first "
    '(for example dist.init_process_group("gloo") on CPU or "nccl" on GPU)'
)


@dataclass(frozen=True)
class Group:
    """A process group as seen from this rank: ``rank`` and ``size`` count within the group."""

    pg: dist.ProcessGroup
    rank: int
    size: int

    def global_rank(self, group_rank: int) -> int:
        """The global rank of a member: point-to-point ops address peers by global rank."""
        return dist.get_global_rank(self.pg, group_rank)


def resolve_group(group: dist.ProcessGroup | None, caller: str) -> Group:
    """The group to run on (the default group for ``None``), or a ValueError if this process
    cannot take part in it."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(f"{caller}: {NOT_INITIALISED}")
    pg = group if group is not None else dist.group.WORLD
    rank = dist.get_rank(pg)
    if rank < 0:
        raise ValueError(
            f"{caller}: this process (global rank {dist.get_rank()}) is not a member of `group`; "
            "call it only on the ranks that created the group with dist.new_group(ranks)"
        )
    return Group(pg, rank, dist.get_world_size(pg))


def check_qkv(caller: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q, k and v must be floating tensors of one shape ``[batch, heads, seq_shard, head_dim]``,
    one dtype and one device."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{caller}: {name} must be a torch.Tensor; got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{caller}: {name} must be 4-D [batch, heads, seq_shard, head_dim]; got shape "
                f"{tuple(t.shape)}; reshape [batch, seq, heads, head_dim] inputs with .transpose(1, 2)"
            )
        if not t.is_floating_point():
            raise ValueError(f"{caller}: {name} must be a floating-point tensor; got {t.dtype}")
    for attr in ("shape", "dtype", "device"):
        values = [getattr(t, attr) for t in (q, k, v)]
        if values[1:] != values[:1] * 2:
            shown = ", ".join(
                f"{n}={tuple(x) if attr == 'shape' else x}" for n, x in zip("qkv", values, strict=True)
            )
            raise ValueError(f"{caller}: q, k and v must have the same {attr}; got {shown}")


def check_divisible(caller: str, length: int, size: int) -> None:
    """The sequence must split into ``size`` equal contiguous shards."""
    if length % size:
        raise ValueError(
            f"{caller}: the sequence length ({length}) must be divisible by the group size ({size}); "
            f"pad the sequence to a multiple of {size}"
        )


class SeqToHeads(torch.autograd.Function):
    """All-to-all from sequence shards to head shards, for any number of tensors at once.

    In:  each tensor ``[batch, heads, seq/P, head_dim]``, this rank's contiguous tokens.
    Out: each tensor ``[batch, heads/P, seq, head_dim]``, this rank's heads over the whole
    sequence, tokens in rank order. The backward pass is the inverse all-to-all.
    """

    @staticmethod
    def forward(ctx, group: Group, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.group = group
        return seq_to_heads(group, xs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return (None, *heads_to_seq(ctx.group, grads))


class HeadsToSeq(torch.autograd.Function):
    """The inverse of :class:`SeqToHeads`; its backward pass is :class:`SeqToHeads`'s forward."""

    @staticmethod
    def forward(ctx, group: Group, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.group = group
        return heads_to_seq(group, xs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return (None, *seq_to_heads(ctx.group, grads))


def seq_to_heads(group: Group, xs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    p = group.size
    b, h, s, d = xs[0].shape
    # One buffer [P, n, batch, heads/P, seq/P, head_dim]: chunk j (dim 0) goes to rank j, and
    # q, k and v travel in a single collective (one latency instead of three).
    recv = _all_to_all(torch.stack([x.reshape(b, p, h // p, s, d).transpose(0, 1) for x in xs], dim=1), group)
    # Chunk j of what arrived holds rank j's tokens: put the shards back in sequence order.
    return tuple(recv[:, i].permute(1, 2, 0, 3, 4).reshape(b, h // p, p * s, d) for i in range(len(xs)))


def heads_to_seq(group: Group, xs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    p = group.size
    b, hp, seq, d = xs[0].shape
    recv = _all_to_all(
        torch.stack([x.reshape(b, hp, p, seq // p, d).permute(2, 0, 1, 3, 4) for x in xs], dim=1), group
    )
    # Chunk j of what arrived holds head group j of this rank's tokens.
    return tuple(recv[:, i].transpose(0, 1).reshape(b, p * hp, seq // p, d) for i in range(len(xs)))


def _all_to_all(send: torch.Tensor, group: Group) -> torch.Tensor:
    """The send buffer is only referenced here, so it is freed before the caller copies the
    received chunks into place."""
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group.pg)
    return recv


def exchange(group: Group, sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]]):
    """Post point-to-point sends and receives (peers as group ranks) without waiting.

    Returns the requests to ``wait()`` on. All ops of one call go in one
    ``batch_isend_irecv``, which NCCL needs so that a send and the receive it pairs with on
    the same two ranks do not wait on each other.
    """
    ops = [dist.P2POp(dist.isend, t, group.global_rank(peer), group.pg) for t, peer in sends]
    ops += [dist.P2POp(dist.irecv, t, group.global_rank(peer), group.pg) for t, peer in recvs]
    return dist.batch_isend_irecv(ops) if ops else []


def wait(requests) -> None:
    for r in requests:
        r.wait()
