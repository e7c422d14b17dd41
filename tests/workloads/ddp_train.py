"""A DDP training job over gloo on 127.0.0.1, profiled with swift_nb on every rank.

    python ddp_train.py OUT_DIR WORLD_SIZE PORT heavy_comm|heavy_compute
All ranks write one job record under OUT_DIR; rank 0 prints its folder.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import swift_nb


def worker(rank: int, world: int, port: int, out: str, kind: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if kind == "heavy_comm":  # 8 M parameters, almost no compute: the all-reduce dominates
        model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.Linear(2048, 2048))
        make_batch = lambda: torch.randn(1, 2048)  # noqa: E731
    else:  # 8 k parameters, a lot of compute per step (jitter between the ranks stays small)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64))
        make_batch = lambda: torch.randn(131072, 64)  # noqa: E731
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    with swift_nb.profile(out_dir=out, wait=1, warmup=1, active=3) as run:
        for _ in range(6):
            ddp(make_batch()).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    dist.destroy_process_group()
    if rank == 0:
        print(run.path, flush=True)


if __name__ == "__main__":
    out_dir, world, port, kind = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    # each rank forked from a server that imported torch and swift_nb once (spawned ranks
    # would each pay those imports again)
    mp.set_forkserver_preload(["torch", "torch._dynamo", "torch.distributed", "swift_nb", "swift_nb.api"])
    mp.start_processes(
        worker, args=(world, port, out_dir, kind), nprocs=world, join=True, start_method="forkserver"
    )
