"""Profiling across ranks on CPU with gloo: step time, communication share and bytes per
step against the analytic volume, and the cost of gathering a long run on rank 0.

    python benchmarks/ranks.py            # P = 1, 2, 4 × DDP, FSDP, plus 1000-step gathers
Each case is a real torchrun job (the script relaunches itself as the worker) whose
record is read back with swift_nb.load_run. Analytic wire bytes per rank and step, ring
algorithms, G = gradient bytes = parameter bytes (fp32):
  DDP   all-reduce 2·(P−1)/P × G
  FSDP  all-gather twice (forward, backward) 2·(P−1)/P × G + reduce-scatter (P−1)/P × G
(gloo has no reduce-scatter: torch runs it as an all-reduce, 2·(P−1)/P × G on the wire.)
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WIDTH = 512
BATCH = 64


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import swift_nb

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH))
    if args.parallel == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH, WIDTH)
    with swift_nb.profile(wait=5, warmup=1, active=4, interval_ms=50, label=args.label):
        for _ in range(args.steps):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(parallel: str, nproc: int, steps: int, root: Path):
    import swift_nb

    runs = root / f"{parallel}-{nproc}-{steps}"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{_free_port()}",
        __file__,
        "--worker",
        "--parallel",
        parallel,
        "--steps",
        str(steps),
    ]
    env = {**os.environ, "SWIFT_NB_DIR": str(runs), "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    (folder,) = [p for p in runs.iterdir() if p.is_dir()]
    return swift_nb.load_run(folder), wall


def analytic_wire_bytes(parallel: str, p: int, grad_bytes: float) -> float:
    ring = (p - 1) / p
    return 2 * ring * grad_bytes if parallel == "ddp" else 3 * ring * grad_bytes


def main() -> None:
    from swift_nb.analysis import analyze
    from swift_nb.analysis.ranks import per_rank
    from swift_nb.core.units import fmt_bytes

    grad_bytes = 2 * (WIDTH * WIDTH + WIDTH) * 4
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for parallel in ("ddp", "fsdp"):
            for p in (1, 2, 4):
                run, _ = launch(parallel, p, 20, root)
                a = analyze(run)
                pr = a.per_rank
                comm = a.collectives[a.collectives["rank"] == 0]
                wire = float(comm["wire_bytes_per_step"].sum())
                payload = float(comm["bytes_per_step"].sum())
                share = float(comm["step_share"].sum()) if p > 1 else 0.0
                rows.append(
                    (
                        parallel,
                        p,
                        f"{float(pr['step_time_median_s'].median()) * 1e3:.2f}",
                        f"{100 * float(pr['collective_share'].median() if p > 1 else share):.1f}",
                        ", ".join(
                            f"{k} {n:g}" for k, n in zip(comm["kind"], comm["calls_per_step"], strict=True)
                        ),
                        fmt_bytes(payload),
                        fmt_bytes(wire),
                        fmt_bytes(analytic_wire_bytes(parallel, p, grad_bytes)),
                    )
                )
        head = (
            "parallel",
            "P",
            "step ms",
            "comm %",
            "collectives/step",
            "payload/step",
            "wire/step",
            "analytic",
        )
        print(
            f"model: 2 × Linear({WIDTH}, {WIDTH}), G = {fmt_bytes(grad_bytes)} fp32; batch {BATCH}; gloo, CPU\n"
        )
        _table(head, rows)
        print()
        gather_rows = []
        for p in (2, 4):
            run, wall = launch("ddp", p, 1000, root)
            gather_rows.append(
                (
                    p,
                    len(run.rank_steps),
                    len(run.rank_samples),
                    f"{run.summary['gather_s'] * 1e3:.1f}",
                    f"{float(per_rank(run)['step_time_median_s'].median()) * 1e3:.2f}",
                    f"{wall:.1f}",
                )
            )
        _table(("P", "steps rows", "sample rows", "gather ms", "step ms", "job wall s"), gather_rows)


def _table(head, rows) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    for r in (head, *rows):
        print("  ".join(str(x).rjust(w) for x, w in zip(r, widths, strict=True)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--parallel", default="ddp")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--label", default=None)
    ns = parser.parse_args()
    worker(ns) if ns.worker else main()
