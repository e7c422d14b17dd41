"""ddp: the model replicated on the ranks of a job with DistributedDataParallel.

The root model is made a DDP module in place (torch's composable ``replicate``, the
``DistributedDataParallel`` machinery without a wrapper object, so the cell's own variable
keeps working): rank 0's parameters are broadcast at the first forward, and gradients are
all-reduced (averaged) in buckets during backward. Parameters, gradients and optimizer state
stay whole on every rank. What each rank reads, and the job it needs, are
:mod:`swift_nb.toggles._distributed`'s.

``grad_dtype=bf16`` all-reduces each bucket in bf16 (half the bytes on the wire, the average
cast back into the fp32 gradients): DDP's own ``bf16_compress_hook`` on NCCL, which it allows
only there; elsewhere (gloo) ``bf16_reduce``, the same algorithm.

``undo()`` removes DDP's class, hooks and state; the parameters were never replaced.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable.replicate import replicate

from swift_nb.toggles._distributed import DataParallel
from swift_nb.toggles.base import Toggle


def bf16_reduce(process_group: dist.ProcessGroup | None, bucket: dist.GradBucket) -> torch.futures.Future:
    """A DDP communication hook: the bucket cast to bf16, divided by the ranks, all-reduced,
    and cast back into the bucket (``bf16_compress_hook``'s algorithm on any backend)."""
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(dist.get_world_size(group))
    future = dist.all_reduce(compressed, group=group, async_op=True).get_future()  # type: ignore[union-attr]

    def decompress(done: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(done.value()[0])
        return buffer

    return future.then(decompress)


# DDP checks a hook's annotations as objects (this module's are strings: postponed evaluation)
bf16_reduce.__annotations__.update(bucket=dist.GradBucket, process_group=dist.ProcessGroup | None)
bf16_reduce.__annotations__["return"] = torch.futures.Future[torch.Tensor]


def bf16_hook() -> Callable[..., torch.futures.Future]:
    """DDP's ``bf16_compress_hook`` where it runs (NCCL), else ``bf16_reduce``."""
    if dist.get_backend() == "nccl":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

        return bf16_compress_hook
    return bf16_reduce


class DDP(DataParallel, Toggle):
    id = "ddp"

    def _wrap(self, model: nn.Module, name: str) -> dict[int, nn.Parameter]:
        assert self.report is not None
        kwargs = {"device_ids": [torch.cuda.current_device()]} if torch.cuda.is_available() else {}
        replicate(model, **kwargs)
        bf16 = self.values.get("grad_dtype") == "bf16"
        if bf16:
            model.register_comm_hook(None, bf16_hook())  # type: ignore[operator]
        self.report.change(
            f"`{name}` ({type(model).__name__}): DistributedDataParallel over {self.values['world_size']} ranks "
            f"(gradients all-reduced in buckets during backward{', in bf16' if bf16 else ''})"
        )
        return {}
