"""``measure_link()``: the link this machine's collectives run over, measured.

Collectives of growing size (all-reduce, all-gather, reduce-scatter; the reductions in fp32
and in bf16) are timed on the
current process group — every rank calls ``measure_link()`` — or, without one, on a job of
``world_size`` processes it starts (gloo on CPU; NCCL where there are enough GPUs). Each
size is run once to warm up, then ``repeats`` times; a time is the slowest rank's (a
collective ends for all when the last one has its data) and the median over repeats is kept.
Per kind, ``t = hops · α + wire / β`` is fitted by least squares on relative error (each size
weighs the same), α ≥ 0 (``swift_nb.core.links``): β is the bus bandwidth
nccl-tests would print for large messages. The points themselves, with nccl-tests' bus
bandwidth for each, are kept in ``Link.measured``. A copy of the largest size on the rank's
device gives ``Link.copy_bw`` (the passes a layout makes over its gradients: DDP's buckets).

Inside ``swift_nb.profile()`` the link is saved in the run's context (``context["link"]``),
so a later ``swift_nb.scale(run)`` uses it.

How much of a collective compute can run under is measured too (``overlap_share``,
``Link.overlap``): gloo runs a collective on CPU threads that need the cores and memory
bandwidth the backward uses, so over loopback little of it hides; over a network slower than
the CPU feeding it, the wait for the wire does; a GPU's NCCL kernels run on their own stream.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from swift_nb.core.errors import ConfigError
from swift_nb.core.links import BF16, KINDS, Fit, Link, hops, wire_bytes

DEFAULT_SIZES_MB = (0.25, 1.0, 4.0, 16.0, 64.0)


def _check(sizes_mb: Sequence[float], repeats: int, world_size: int, kinds: Sequence[str]) -> None:
    if not sizes_mb or any(
        not isinstance(s, (int, float)) or isinstance(s, bool) or not s > 0 for s in sizes_mb
    ):
        raise ConfigError("sizes_mb", "give one or more sizes in MB, each above 0", sizes_mb)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError("repeats", "must be a whole number of at least 1", repeats)
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ConfigError("world_size", "a link joins at least 2 ranks", world_size)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ConfigError("kinds", f"choose among {', '.join(KINDS)}", kinds)


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _once(kind: str, numel: int, n: int, device: torch.device, dtype: torch.dtype = torch.float32) -> Any:
    """A callable running one collective whose payload is ``numel`` elements of ``dtype``."""
    if kind == "all_reduce":
        buf = torch.ones(numel, device=device, dtype=dtype)
        return lambda: dist.all_reduce(buf)
    if kind == "all_gather":
        part = torch.ones(max(1, numel // n), device=device, dtype=dtype)
        out = torch.empty(part.numel() * n, device=device, dtype=dtype)
        gather = getattr(
            dist, "all_gather_single", dist.all_gather_into_tensor
        )  # the newer name; the older warns
        return lambda: gather(out, part)
    whole = torch.ones(max(n, numel - numel % n), device=device, dtype=dtype)
    out = torch.empty(whole.numel() // n, device=device, dtype=dtype)
    scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    return lambda: scatter(out, whole)


def _variants(kinds: Sequence[str]) -> list[tuple[str, str, torch.dtype]]:
    """(label, kind, dtype) to time: each kind in fp32, and the reductions in bf16 too
    (``kind@bf16``: a backend may reduce bf16 at another rate per byte than fp32, as gloo's
    CPU reduction does)."""
    out = [(k, k, torch.float32) for k in kinds]
    out += [(f"{k}{BF16}", k, torch.bfloat16) for k in kinds if k in ("all_reduce", "reduce_scatter")]
    return out


def _time(run: Any, device: torch.device, repeats: int) -> float:
    cuda = device.type == "cuda"
    times = []
    for i in range(repeats + 1):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize(device)
        took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)  # a collective ends when its slowest rank does
        if i:  # the first is a warm-up
            times.append(float(took))
    return float(np.median(times))


def points(sizes_mb: Sequence[float], repeats: int, kinds: Sequence[str]) -> list[dict[str, Any]]:
    """Each kind × size timed on the current process group: ``kind``, ``bytes`` (the
    payload: all-reduce's buffer, all-gather's output, reduce-scatter's input), ``seconds``,
    ``busbw`` (nccl-tests' bus bandwidth, wire bytes / time)."""
    n, device = dist.get_world_size(), _device()
    out = []
    for label, kind, dtype in _variants(kinds):
        try:  # a kind the backend lacks is left out (every rank fails alike)
            _once(kind, n, n, device, dtype)()
        except (RuntimeError, NotImplementedError, TypeError):
            continue
        size = torch.finfo(dtype).bits // 8
        for mb in sorted(sizes_mb):
            numel = max(n, int(mb * 1e6 / size))
            run = _once(kind, numel, n, device, dtype)
            payload = float(size * (numel - numel % n if kind != "all_reduce" else numel))
            t = _time(run, device, repeats)
            out.append(
                {"kind": label, "bytes": payload, "seconds": t, "busbw": wire_bytes(kind, payload, n) / t}
            )
    return out


def copy_bandwidth(nbytes: float, repeats: int) -> float:
    """Bytes per second one tensor copy on this rank's device runs at (median of
    ``repeats``), the pass a layout makes over its gradients besides the collectives."""
    device = _device()
    src = torch.ones(max(1, int(nbytes // 4)), device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            times.append(time.perf_counter() - t0)
    return 4.0 * src.numel() / float(np.median(times))


def fit(rows: Sequence[dict[str, Any]], n: int) -> dict[str, Fit]:
    """α per hop and β per kind: ``t = hops·α + wire/β`` by least squares on t's relative
    error, α ≥ 0 and β > 0 (timings that do not grow with the size, which a busy machine
    gives at sizes the latency dominates, are priced as bandwidth alone)."""
    fits = {}
    for kind in {r["kind"] for r in rows}:
        mine = [r for r in rows if r["kind"] == kind]
        base = kind.removesuffix(BF16)
        t = np.array([r["seconds"] for r in mine])
        wire = np.array([wire_bytes(base, r["bytes"], n) for r in mine])
        a = np.column_stack([np.full_like(t, hops(base, n)), wire]) / t[:, None]
        (alpha, inv_beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
        if alpha < 0 or inv_beta <= 0 or len(t) < 2:  # a line that falls: all bandwidth
            alpha, inv_beta = 0.0, float(np.sum(wire / t) / np.sum((wire / t) ** 2))
        fits[kind] = Fit(float(alpha), float(1.0 / inv_beta))
    return fits


def _compute(device: torch.device, seconds: float) -> Any:
    """A callable of matmuls on ``device`` that takes about ``seconds``, the same on every
    rank (the slowest rank's calibration)."""
    a = torch.randn(256, 256, device=device)
    one = _time(lambda: a @ a, device, 3)
    k = torch.tensor([max(1, round(seconds / max(one, 1e-9)))], dtype=torch.float64)
    dist.all_reduce(k, op=dist.ReduceOp.MAX)
    count = int(k)

    def run() -> None:
        for _ in range(count):
            a @ a

    return run


def overlap_share(nbytes: float, repeats: int) -> float:
    """The share of a collective's time that compute beside it runs under, measured: an
    all-reduce of ``nbytes`` alone (T), matmuls of about as long alone (C), then the
    all-reduce started asynchronously — as DDP starts its buckets' — with the matmuls
    beside it (B). ``(C + T − B) / min(C, T)``, within [0, 1]: 1 where the collective runs
    beside compute (a GPU's own stream, a network slower than the CPU feeding it), 0 where
    they take turns (gloo on cores the compute already uses)."""
    device = _device()
    collective = _once("all_reduce", max(2, int(nbytes // 4)), dist.get_world_size(), device)
    alone = _time(collective, device, repeats)
    compute = _compute(device, alone)
    busy = _time(compute, device, repeats)
    buf = torch.ones(max(2, int(nbytes // 4)), device=device)

    def both() -> None:
        work = dist.all_reduce(buf, async_op=True)
        compute()
        assert work is not None
        work.wait()

    together = _time(both, device, repeats)
    return float(min(1.0, max(0.0, (busy + alone - together) / min(busy, alone))))


def _link(rows: list[dict[str, Any]], n: int, copy_bw: float, overlap: float) -> Link:
    backend = dist.get_backend()
    device = "cuda" if backend == "nccl" else "cpu"
    fits = fit(rows, n)
    big = max(r["bytes"] for r in rows)
    measured = {
        "world_size": n,
        "backend": backend,
        "device": device,
        "host": os.uname().nodename,
        "points": rows,
        "threads": torch.get_num_threads(),
    }
    ar = fits.get("all_reduce") or next(iter(fits.values()))
    return Link(
        name=f"measured {backend} ({n} ranks, {device})",
        fits=fits,
        overlap=overlap,
        source=(
            f"measured by swift_nb.measure_link(): {backend}, {n} ranks on {os.uname().nodename}, "
            f"{ar.busbw / 1e9:.3g} GB/s bus bandwidth up to {big / 1e6:.3g} MB"
        ),
        backend=backend,
        copy_bw=copy_bw,
        measured=measured,
    )


def _spawned(rank: int, n: int, port: int, backend: str, args: tuple, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=n, timeout=timedelta(seconds=120))
    try:
        rows = points(*args)
        copy_bw = copy_bandwidth(max(args[0]) * 1e6, args[1])
        overlap = overlap_share(max(args[0]) * 1e6, args[1])
        if rank == 0:
            out.put(_link(rows, n, copy_bw, overlap).to_dict())
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure_link(
    sizes_mb: Sequence[float] = DEFAULT_SIZES_MB,
    repeats: int = 5,
    *,
    world_size: int = 2,
    kinds: Sequence[str] = KINDS,
) -> Link:
    """The link collectives run over here: α and β per kind of collective (module docstring).

    Args:
        sizes_mb: payload sizes to time, in MB (10⁶ bytes).
        repeats: timed runs per size (after one warm-up).
        world_size: processes of the job started when no process group is initialized.
        kinds: which collectives to time.

    Returns:
        A ``Link`` for ``swift_nb.scale(link=...)``.

    Raises:
        ConfigError: a bad argument, before anything runs.
    """
    _check(sizes_mb, repeats, world_size, kinds)
    if dist.is_available() and dist.is_initialized():
        rows = points(sizes_mb, repeats, kinds)
        big = max(sizes_mb) * 1e6
        link = _link(rows, dist.get_world_size(), copy_bandwidth(big, repeats), overlap_share(big, repeats))
    else:
        link = _spawn(sizes_mb, repeats, world_size, kinds)
    from swift_nb.capture import session

    running = session.running()
    if running is not None:
        running.run.context["link"] = link.to_dict()
    return link


def _spawn(sizes_mb: Sequence[float], repeats: int, world_size: int, kinds: Sequence[str]) -> Link:
    import torch.multiprocessing as mp

    backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    args = (tuple(sizes_mb), repeats, tuple(kinds))
    mp.start_processes(
        _spawned,
        args=(world_size, _free_port(), backend, args, out),
        nprocs=world_size,
        join=True,
        start_method="spawn",
    )
    return Link.from_dict(out.get())
