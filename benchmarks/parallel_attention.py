"""Sequence-parallel attention on CPU over gloo: time, memory and bytes sent per rank.

For each group size P, P processes on 127.0.0.1 (one thread each) run causal
``ulysses_attention`` and ``ring_attention`` (``--chunk`` tokens per tile) on a
``[batch, heads, seq/P, head_dim]`` fp32 shard per rank, forward then backward:
  fwd+bwd s   median wall time of a forward and backward over ``--repeats`` calls, for the
              slowest and the fastest rank (ranks start each call together after a barrier)
  peak MiB    the most tensor bytes live at once during one forward and backward, above the
              inputs already allocated, from torch.profiler's memory events (every tensor
              the CPU allocator hands out, communication buffers included; gloo's own
              socket buffers are not tensors and are not counted); largest rank
  sent MiB    bytes this rank sent during one call (all_to_all_single: the chunks bound for
              other ranks; batch_isend_irecv: the isend tensors), counted by wrapping those
              two functions, next to the analytic volume: Ulysses sends (P-1)/P of q, k, v
              and the output forward and of their gradients backward; the ring sends one K/V
              block per step it forwards (causal: rank r forwards r+1 blocks, the last rank
              none) and, backward, K/V again plus each block's fp32 dK/dV. Largest rank;
              ``ok`` when every rank's count equals its analytic volume.
On a machine with fewer cores than P, ranks share cores and the times grow accordingly.

    python benchmarks/parallel_attention.py [--worlds 1 2 4] [--seqs 2048 4096] [--heads 4]
        [--head-dim 64] [--chunk 512] [--repeats 2] [--no-causal]
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile

from swift_nb.parallel import ring_attention, ulysses_attention

MiB = 2**20


class CommCounter:
    """Counts the bytes this rank sends through all_to_all_single and batch_isend_irecv,
    per phase (``counter.phase = "fwd"`` / ``"bwd"``)."""

    def __init__(self, world: int) -> None:
        self.world, self.phase, self.sent = world, "fwd", {"fwd": 0, "bwd": 0}

    def __enter__(self) -> CommCounter:
        self.a2a, self.p2p = dist.all_to_all_single, dist.batch_isend_irecv

        def all_to_all_single(output, input, *args, **kwargs):
            self.sent[self.phase] += input.nbytes * (self.world - 1) // self.world
            return self.a2a(output, input, *args, **kwargs)

        def batch_isend_irecv(ops):
            self.sent[self.phase] += sum(op.tensor.nbytes for op in ops if op.op is dist.isend)
            return self.p2p(ops)

        dist.all_to_all_single, dist.batch_isend_irecv = all_to_all_single, batch_isend_irecv
        return self

    def __exit__(self, *exc) -> None:
        dist.all_to_all_single, dist.batch_isend_irecv = self.a2a, self.p2p


def analytic_sent(mode: str, rank: int, world: int, causal: bool, shard_bytes: int) -> dict[str, int]:
    """Bytes this rank should send in one forward and one backward (fp32 shards)."""
    if world == 1:
        return {"fwd": 0, "bwd": 0}
    if mode == "ulysses":
        per_call = 4 * shard_bytes * (world - 1) // world
        return {"fwd": per_call, "bwd": per_call}
    if not causal:
        kv_sends, dkdv_sends = world - 1, world
    elif rank < world - 1:
        kv_sends, dkdv_sends = rank + 1, rank + 1
    else:  # the last rank forwards no K/V and sends every other block's finished dK/dV home
        kv_sends, dkdv_sends = 0, world - 1
    kv = kv_sends * 2 * shard_bytes
    return {"fwd": kv, "bwd": kv + dkdv_sends * 2 * shard_bytes}


def peak_bytes(step) -> int:
    """Most tensor bytes live at once during ``step()``, above those live before it."""
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
        key=lambda e: e.start_ns(),
    )
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def measure(mode: str, seq: int, world: int, rank: int, args) -> dict:
    shape = (1, args.heads, seq // world, args.head_dim)
    gen = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(shape, generator=gen).requires_grad_() for _ in range(3))
    dout = torch.randn(shape, generator=gen)
    kwargs = {"causal": args.causal}
    if mode == "ring":
        fn, kwargs["chunk_size"] = ring_attention, args.chunk
    else:
        fn = ulysses_attention

    def step(counter: CommCounter | None = None) -> None:
        out = fn(q, k, v, **kwargs)
        if counter:
            counter.phase = "bwd"
        out.backward(dout)
        q.grad = k.grad = v.grad = None

    with CommCounter(world) as counter:  # doubles as the warm-up call
        step(counter)
    times = []
    for _ in range(args.repeats):
        dist.barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    dist.barrier()
    peak = peak_bytes(step)
    return {
        "mode": mode,
        "seq": seq,
        "time_s": statistics.median(times),
        "peak_bytes": peak,
        "sent": counter.sent,
        "analytic": analytic_sent(mode, rank, world, args.causal, q.nbytes),
    }


def worker(rank: int, world: int, port: int, args, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(minutes=10),
    )
    rows = [measure(mode, seq, world, rank, args) for seq in args.seqs for mode in ("ulysses", "ring")]
    results.put((rank, rows))
    dist.barrier()
    dist.destroy_process_group()


def run_world(world: int, args) -> list[list[dict]]:
    """Per configuration, every rank's measurements."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=worker, args=(r, world, port, args, results)) for r in range(world)]
    for p in procs:
        p.start()
    by_rank = dict(results.get() for _ in range(world))
    for p in procs:
        p.join()
    return [list(ranks) for ranks in zip(*(by_rank[r] for r in range(world)), strict=True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--seqs", type=int, nargs="+", default=[2048, 4096])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=512, help="ring_attention chunk_size (tokens)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()

    print(
        f"batch 1, {args.heads} heads, head_dim {args.head_dim}, fp32, causal={args.causal}, "
        f"ring chunk_size {args.chunk}, gloo on 127.0.0.1, 1 thread per rank, {os.cpu_count()} cores"
    )
    header = (
        f"{'mode':8} {'P':>2} {'seq':>6} {'fwd+bwd s':>15} {'peak MiB':>9} "
        f"{'sent fwd MiB':>16} {'sent bwd MiB':>16} {'':>3}"
    )
    print(header)
    print(
        f"{'':8} {'':>2} {'':>6} {'slowest/fastest':>15} {'max rank':>9} {'meas / analytic':>16} {'meas / analytic':>16}"
    )
    for world in args.worlds:
        for ranks in run_world(world, args):
            r0 = ranks[0]
            times = [r["time_s"] for r in ranks]
            sent = {ph: max(r["sent"][ph] for r in ranks) / MiB for ph in ("fwd", "bwd")}
            analytic = {ph: max(r["analytic"][ph] for r in ranks) / MiB for ph in ("fwd", "bwd")}
            match = "ok" if all(r["sent"] == r["analytic"] for r in ranks) else "!="
            print(
                f"{r0['mode']:8} {world:>2} {r0['seq']:>6} {max(times):>7.2f}/{min(times):<7.2f} "
                f"{max(r['peak_bytes'] for r in ranks) / MiB:>9.1f} "
                f"{sent['fwd']:>7.1f} / {analytic['fwd']:<6.1f} {sent['bwd']:>7.1f} / {analytic['bwd']:<6.1f} {match:>3}",
                flush=True,
            )


if __name__ == "__main__":
    main()
