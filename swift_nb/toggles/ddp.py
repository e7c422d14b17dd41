"""ddp: the model replicated on the ranks of a job with DistributedDataParallel.

The root model is made a DDP module in place (torch's composable ``replicate``, the
``DistributedDataParallel`` machinery without a wrapper object, so the cell's own variable
keeps working): rank 0's parameters are broadcast at the first forward, and gradients are
all-reduced (averaged) in buckets during backward. Parameters, gradients and optimizer state
stay whole on every rank. What each rank reads, and the job it needs, are
:mod:`swift_nb.toggles._distributed`'s.

``undo()`` removes DDP's class, hooks and state; the parameters were never replaced.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed._composable.replicate import replicate

from swift_nb.toggles._distributed import DataParallel
from swift_nb.toggles.base import Toggle


class DDP(DataParallel, Toggle):
    id = "ddp"

    def _wrap(self, model: nn.Module, name: str) -> dict[int, nn.Parameter]:
        assert self.report is not None
        kwargs = {"device_ids": [torch.cuda.current_device()]} if torch.cuda.is_available() else {}
        replicate(model, **kwargs)
        self.report.change(
            f"`{name}` ({type(model).__name__}): DistributedDataParallel over {self.values['world_size']} ranks "
            "(gradients all-reduced in buckets during backward)"
        )
        return {}
