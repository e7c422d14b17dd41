"""fsdp: the model sharded over the ranks of a job with FSDP2 (``fully_shard``).

Each repeated block (the container of same-type modules holding the most parameters, as
gradient checkpointing finds it: transformer layers) is wrapped with ``fully_shard``, then
the root: parameters, gradients and optimizer state are split over ``world_size`` ranks
(each rank keeps ``1/world_size`` of every parameter, as a DTensor), a block's parameters
are gathered for its forward and backward and freed after, and gradients are
reduce-scattered (in bf16 with ``grad_dtype=bf16``: ``MixedPrecisionPolicy(reduce_dtype=...)``).
Optimizers are moved onto the sharded parameters before their first step.
What each rank reads, and the job it needs, are :mod:`swift_nb.toggles._distributed`'s.

``undo()`` gathers every parameter back into the original ``nn.Parameter`` objects (a
collective: all ranks undo together), puts them on their modules, and removes FSDP's
classes, hooks and state; optimizer state is gathered back likewise. While applied, the
original parameters hold no storage.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from swift_nb.capture.models import repeated_blocks
from swift_nb.toggles._distributed import DataParallel, restore_parameters
from swift_nb.toggles.base import Toggle


class FSDP(DataParallel, Toggle):
    id = "fsdp"

    def _wrap(self, model: nn.Module, name: str) -> dict[int, nn.Parameter]:
        assert self.report is not None
        owners = [
            (m, pname, p, p.shape)
            for m in model.modules()
            for pname, p in m._parameters.items()
            if p is not None
        ]
        found = repeated_blocks(model)
        blocks = found[1] if found else []
        what = f"`{name}` ({type(model).__name__})"
        kind = type(blocks[0]).__name__ if blocks else ""
        device = torch.cuda.current_device() if torch.cuda.is_available() else None
        mesh = None
        if device is not None:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cuda", (self.values["world_size"],))
        policy = MixedPrecisionPolicy(
            reduce_dtype=torch.bfloat16 if self.values.get("grad_dtype") == "bf16" else None
        )
        for block in blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        self._undo.append(restore_parameters(owners))
        moved = {}
        for m, pname, old, _ in owners:
            new = m._parameters[pname]
            if new is not old:
                moved[id(old)] = new
                old.data = torch.empty(0, dtype=old.dtype, device=old.device)  # its values live in the shards
        size = self.values["world_size"]
        if blocks:
            where = f"{name}.{found[0]}" if found[0] else name
            self.report.change(
                f"{what}: {len(blocks)} {kind} blocks in `{where}` and the root sharded "
                f"with fully_shard over {size} ranks"
            )
        else:
            self.report.change(
                f"{what}: sharded with fully_shard over {size} ranks (as one unit: no repeated blocks)"
            )
        self.report.details["sharded_blocks"] = self.report.details.get("sharded_blocks", 0) + len(blocks)
        return moved
