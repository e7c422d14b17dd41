"""The same training loop on one process, or as a DDP or FSDP2 job over gloo on 127.0.0.1,
profiled with swift_nb on every rank: what ``swift_nb.scale`` forecasts from the one-process
run, measured.

    python scale_train.py OUT_DIR WORLD PORT MODEL LAYOUT [GRAD_DTYPE] [STEPS]

MODEL: ``comm`` (a residual MLP of 12.6 M parameters, 50 MB of fp32 gradients, batch 32:
the all-reduce dominates) or ``compute`` (0.6 M parameters, batch 2048: the matmuls do);
LAYOUT: ``single`` (WORLD 1, no process group), ``ddp`` or ``fsdp`` (or ``link``: the link
measured with ``swift_nb.measure_link()`` on the job's process group, saved as link.json); GRAD_DTYPE: ``fp32``
(default) or ``bf16`` (``swift_nb.toggles.ddp.bf16_hook``, FSDP2's ``reduce_dtype``). Each rank
runs one torch thread on the same per-rank batch. Rank 0 prints its record's folder. With
``RANK`` set, the process is that one rank (``MASTER_ADDR`` from the environment, default
127.0.0.1), as torchrun or a launcher in a network namespace starts it.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import swift_nb

MODELS = {"comm": (1024, 12, 32), "compute": (384, 4, 2048)}  # width, blocks, batch


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.fc(x))


class ResidualMLP(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def _wrap(model: nn.Module, layout: str, grad: str) -> nn.Module:
    if layout == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        from swift_nb.toggles.ddp import bf16_hook

        ddp = DistributedDataParallel(model)
        if grad == "bf16":
            ddp.register_comm_hook(None, bf16_hook())
        return ddp
    if layout == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16 if grad == "bf16" else None)
        for block in model.blocks:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    return model


def train(out: str, kind: str, layout: str, grad: str, steps: int, world: int) -> swift_nb.Run:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    width, depth, batch = MODELS[kind]
    model = _wrap(ResidualMLP(width, depth), layout, grad)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x, y = torch.randn(batch, width), torch.randn(batch, 1)
    label = f"{kind}-{layout}-{grad}-{world}"
    with swift_nb.profile(out_dir=out, label=label, wait=1, warmup=1, active=2) as run:
        for _ in range(steps):
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return run


def worker(rank: int, world: int, port: int, args: tuple) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.update(MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    if args[2] == "link":  # the link itself, measured on this job's process group
        torch.set_num_threads(1)
        link = swift_nb.measure_link()
        dist.destroy_process_group()
        if rank == 0:
            path = os.path.join(args[0], "link.json")
            with open(path, "w") as f:
                json.dump(link.to_dict(), f)
            print(path, flush=True)
        return
    run = train(*args, world)
    dist.destroy_process_group()
    if rank == 0:
        print(run.path, flush=True)


def main(argv: list[str]) -> None:
    out, world, port, kind, layout = argv[0], int(argv[1]), int(argv[2]), argv[3], argv[4]
    grad = argv[5] if len(argv) > 5 else "fp32"
    steps = int(argv[6]) if len(argv) > 6 else 12
    if layout == "single":
        print(train(out, kind, layout, grad, steps, 1).path, flush=True)
        return
    if "RANK" in os.environ:  # one rank launched on its own (torchrun, or in a network namespace)
        worker(int(os.environ["RANK"]), world, port, (out, kind, layout, grad, steps))
        return
    mp.set_forkserver_preload(["torch", "torch.distributed", "swift_nb", "swift_nb.api"])
    mp.start_processes(
        worker,
        args=(world, port, (out, kind, layout, grad, steps)),
        nprocs=world,
        join=True,
        start_method="forkserver",
    )


if __name__ == "__main__":
    main(sys.argv[1:])
