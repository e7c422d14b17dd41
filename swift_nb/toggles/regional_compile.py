"""regional_compile: ``torch.compile`` of each repeated block (the transformer layers)
instead of the whole model.

The blocks are one class running one ``forward``: dynamo compiles that code once and every
block reuses it (its parameters are inputs of the graph, not constants), so compile time is
one block's, not the model's. Measured on a 4-block GPT on this project's CPU benchmark:
about half of whole-model ``torch_compile``'s first step, with the same losses.

The blocks are found as gradient checkpointing finds them (the largest container of ≥ 2
modules of one type); each block's ``forward`` is replaced on the instance by its compiled
version and put back by ``undo()``. A model with no repeated blocks is left eager, with a
note: compile it whole with ``torch_compile``. The compiler check (a C++ compiler for
Inductor on CPU) and the hook that finds models built by the cell are ``torch_compile``'s.
"""

from __future__ import annotations

import torch
from torch import nn

from swift_nb.capture.models import repeated_blocks
from swift_nb.toggles.torch_compile import _ABSENT, TorchCompile, _compiled


class RegionalCompile(TorchCompile):
    id = "regional_compile"

    def _apply_model(self, model: nn.Module, name: str) -> None:
        assert self.report is not None
        found = repeated_blocks(model)
        if found is None:
            self.report.note(
                f"`{name}` ({type(model).__name__}) has no repeated blocks: left eager (use torch_compile)"
            )
            return
        path, blocks = found
        mode, dynamic, backend = self.values["mode"], self.values["dynamic"], self.values["backend"]
        compiled = 0
        for block in blocks:
            if _compiled(block.forward):
                continue
            own = block.__dict__.get("forward", _ABSENT)
            block.forward = torch.compile(
                block.forward, mode=None if mode == "default" else mode, dynamic=dynamic, backend=backend
            )
            self._undo.append(_restorer(block, own))
            compiled += 1
        if not compiled:
            self.report.note(f"`{name}`'s blocks are compiled already: left as they are")
            return
        where = f"{name}.{path}" if path else name
        self.report.change(
            f"`{where}`: {compiled} {type(blocks[0]).__name__} blocks compiled, one code for all "
            f"(backend={backend}, mode={mode})"
        )
        d = self.report.details
        d["compiled_blocks"] = d.get("compiled_blocks", 0) + compiled
        d["compiled_models"] = d.get("compiled_models", 0) + 1

    def _nothing_found(self) -> str:
        return "no model ran a forward pass while the toggle was applied: nothing was compiled"


def _restorer(block: nn.Module, own: object):
    def restore() -> None:
        if own is _ABSENT:
            block.__dict__.pop("forward", None)
        else:
            block.forward = own

    return restore
