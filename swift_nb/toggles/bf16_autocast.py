"""bf16 autocast: the cell's matmuls, convolutions and linear layers run in bfloat16.

``torch.autocast`` is entered for the cell when the toggle is applied and left when it is
undone, on the CPU and, when there is one, on CUDA: every model the cell runs is covered,
those built inside it and those a Trainer wraps included, with no change to the code.
Parameters, gradients and the optimizer's state stay in their own dtype (fp32 master
weights, as mixed precision keeps them); the activations autocast produces are bfloat16,
half the bytes of fp32 ones. Ops autocast keeps in fp32 (softmax, losses, norms' reductions)
stay so. bfloat16 has fp32's exponent range, so no loss scaling is needed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from swift_nb.toggles.base import Toggle


def autocast_devices() -> list[str]:
    """The device types autocast is entered for: the CPU, and CUDA when available."""
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


class BF16Autocast(Toggle):
    id = "bf16_autocast"

    def apply(self, namespace: Any = None):
        report = super().apply(namespace)  # notes the models it finds, for the report
        try:
            for device in autocast_devices():
                ctx = torch.autocast(device_type=device, dtype=torch.bfloat16)
                ctx.__enter__()
                self._undo.append(lambda ctx=ctx: ctx.__exit__(None, None, None))
        except BaseException:
            self.undo()
            raise
        report.change(
            f"autocast to bfloat16 on {' and '.join(autocast_devices())} until the cell ends: matmuls, "
            "convolutions and linear layers compute in bfloat16; parameters, gradients and optimizer "
            "state keep their dtype"
        )
        return report

    def _apply_model(self, model: nn.Module, name: str) -> None:
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
        report = self.report
        assert report is not None
        if dtypes == ["bfloat16"]:
            report.note(f"{name}: its parameters are bfloat16 already; autocast changes little")
        report.details.setdefault("parameter_dtypes", {})[name] = dtypes

    def _nothing_found(self) -> str:
        return "no model was found in the namespace; autocast still covers every model the cell runs"
