"""A training script as people write it for torchrun, profiled with ``swift_nb.profile()``.

    python -m torch.distributed.run --nproc-per-node N ranks_job.py [options]
Run records go to $SWIFT_NB_DIR. Options inject the faults the tests need: a slow rank,
a rank that raises, one killed by a signal, one that never enters profile().
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import swift_nb


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--parallel", choices=["ddp", "fsdp"], default="ddp")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--label", default=None)
    p.add_argument("--active", type=int, default=2)
    p.add_argument("--sleep-rank", type=int, default=-1)
    p.add_argument("--sleep-s", type=float, default=0.0)
    p.add_argument("--raise-rank", type=int, default=-1)
    p.add_argument("--raise-oom", action="store_true", help="the injected failure is an allocation failure")
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--fault-step", type=int, default=4)
    p.add_argument("--skip-rank", type=int, default=-1)
    p.add_argument("--pg-timeout-s", type=float, default=1800)
    p.add_argument("--own-folders", action="store_true", help="each rank writes under $SWIFT_NB_DIR/rank<R>")
    args = p.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout_s))
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    w = args.width
    model = torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, w))
    if args.parallel == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def train(steps: int) -> None:
        for i in range(steps):
            if rank == args.sleep_rank:
                time.sleep(args.sleep_s)
            if i == args.fault_step and rank == args.raise_rank:
                if args.raise_oom:
                    raise torch.OutOfMemoryError(
                        f"CUDA out of memory. Tried to allocate 1.00 GiB (rank {rank})"
                    )
                raise ValueError(f"injected failure on rank {rank} at step {i}")
            if i == args.fault_step and rank == args.kill_rank:
                os.kill(os.getpid(), signal.SIGKILL)
            model(torch.randn(args.batch, w)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()

    if rank == args.skip_rank:
        train(args.steps)
    else:
        out = os.path.join(os.environ["SWIFT_NB_DIR"], f"rank{rank}") if args.own_folders else None
        with swift_nb.profile(wait=0, warmup=1, active=args.active, label=args.label, out_dir=out) as run:
            train(args.steps)
        print(f"RUN {rank} {run.path}", flush=True)
    if args.skip_rank >= 0:
        # the rank that never profiles waits for the others before tearing its group down:
        # destroyed while rank 0 still waited on the store, it aborted once under load
        # ("terminate called without an active exception")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
