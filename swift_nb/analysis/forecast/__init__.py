"""Will it fit? The peak tensor memory of a training step at another batch size, sequence
length, dtype, optimizer, toggle set, world size or device, scaled from what a run measured.

What scales how (per rank; B samples of T tokens):
- parameters, gradients and optimizer state: exactly, from the parameter count and the bytes
  per element (fp32 4, bf16/fp16 2), the optimizer's states per parameter (Adam/AdamW 2,
  SGD with momentum 1, without 0, 8-bit Adam 2 of 1 byte, Adafactor factored, GaLore's
  low-rank moments) and ZeRO/FSDP sharding. Gradients count as many as were alive at the
  measured peak (backward frees activations while it makes gradients).
- frozen weights (a LoRA base, a frozen encoder, a reference model): exactly, at their dtype;
  under ``qlora`` the base's linear layers at bitsandbytes' 4-bit NF4 (n/2 packed + an fp32
  absmax per 64: 4.5 bits each), the rest in bf16. ``lora(r=…)`` on a full fine-tune freezes
  the model's weights and trains r·(in + out) per adapted linear layer (the trace's shapes),
  gradients and optimizer state for those alone, and adds the adapters' own activations
  (x·A, r per token per layer: approximate); on a LoRA run it changes its adapters' rank.
- activations and other tensors: linear in B·T, plus the [.., T, T] tensors of an eager
  attention (scores, probabilities, masks and their gradients), which grow as B·T². One run
  cannot tell the two apart from its totals: the trace's allocations can (tensors of a
  softmax's [.., T, T] shape made by ops on such tensors), and a ``calibration`` run at another batch size or sequence length fits
  them from two points.
- the whole step: the run's memory timeline is scaled point by point and its maximum taken,
  so a peak that moves (from backward to the optimizer step when activations shrink) is
  found where it moves to.

``forecast(run, "H100-80GB", batch_size=32, seq_len=4096, dtype="bf16")`` returns a
``Forecast``: bytes by category, the device's room (capacity less the CUDA context), whether
it fits, the headroom, the largest batch and sequence that fit, and the derivation of every
number in words.

One module per job: ``spec`` (what a forecast takes: dtypes, toggles, the spec line),
``measure`` (what the run measured), ``growth`` (how activations grow), ``finetune`` (the
layers LoRA adapts, the frozen weights' bytes), ``pricing`` (the bytes of each category for
a configuration), ``result`` (``Config``, ``Peak``,
``Forecast``) and ``predict`` (``forecast()`` itself). The devices are ``swift_nb.core.devices``;
the [.., T, T] tensors are found by ``swift_nb.analysis.scores``; the HTML of a forecast
is ``swift_nb.render.forecast``'s.
"""

from swift_nb.analysis.effects import OPTIMIZERS
from swift_nb.analysis.forecast.measure import PARTS, Measured, ScoreBytes, measure
from swift_nb.analysis.forecast.predict import forecast
from swift_nb.analysis.forecast.result import Forecast
from swift_nb.core.devices import DEVICES, resolve_device
from swift_nb.vocabulary.forecast_spec import parse_forecast_spec, parse_toggles

__all__ = [
    "DEVICES",
    "OPTIMIZERS",
    "PARTS",
    "Forecast",
    "Measured",
    "ScoreBytes",
    "forecast",
    "measure",
    "parse_forecast_spec",
    "parse_toggles",
    "resolve_device",
]
