"""The GPUs swift_nb knows: what each holds and how fast it multiplies, in one table.

``DEVICES``: the memory presets a forecast takes by name (``"H100-80GB"``), with
``DEFAULT_DEVICE`` the one it takes when none is named; ``resolve_device`` reads a preset, a
number of bytes or ``"80GB"``. ``PEAK_FLOPS_PER_S``: the dense tensor-core peak of a GPU
named as ``torch.cuda.get_device_name`` names it, which throughput divides by for MFU.

A module of facts with no analysis in it, below every layer that reads it (the forecast,
throughput, the forecast form), so that none of them imports another to learn a device.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, NamedTuple

from swift_nb.core.errors import ConfigError
from swift_nb.core.units import fmt_bytes

MIB = 1 << 20
GIB = 1 << 30

#: Outside torch's allocator, a process that has initialised CUDA, cuBLAS and cuDNN holds
#: the CUDA context, its loaded kernels and the libraries' handles: nvidia-smi's figure for
#: the process minus torch.cuda.memory_reserved(). With torch 2.x on CUDA 12, whose lazy
#: module loading (the default since 11.7) loads only the kernels a process uses, that is
#: commonly 0.4–0.6 GiB on Ampere and Hopper GPUs (1–2 GiB with CUDA_MODULE_LOADING=EAGER
#: or CUDA 11); 512 MiB is the estimate used here, also for a capacity given as a number.
CUDA_CONTEXT_BYTES = 512 * MIB
#: ROCm's runtime and its BLAS workspaces: no published figure; an estimate.
ROCM_CONTEXT_BYTES = 1 * GIB


class Device(NamedTuple):
    """A GPU: ``capacity_bytes`` as ``torch.cuda.get_device_properties(i).total_memory``
    reports it (NVIDIA's "80 GB" are decimal, and part of it is reserved by the driver),
    ``context_bytes`` what the CUDA context takes of it, ``source`` where the numbers come from.
    (``capability``: its CUDA compute capability, which toggles such as fp8 need; None for
    a capacity given as a number, or a device that is not NVIDIA's.)"""

    name: str
    capacity_bytes: int
    context_bytes: int
    source: str
    kind: str = "cuda"  # "cuda" (any GPU, ROCm's too) or "cpu": whose implementations run

    @property
    def capability(self) -> tuple[int, int] | None:
        return CAPABILITY.get(self.name)


#: CUDA compute capability of the presets (NVIDIA's CUDA GPUs table)
CAPABILITY: dict[str, tuple[int, int]] = {
    "A100-40GB": (8, 0),
    "A100-80GB": (8, 0),
    "H100-80GB": (9, 0),
    "H100-94GB": (9, 0),
    "H200-141GB": (9, 0),
    "L4-24GB": (8, 9),
    "A10G-24GB": (8, 6),
    "RTX4090-24GB": (8, 9),
    "V100-16GB": (7, 0),
    "V100-32GB": (7, 0),
    "T4-16GB": (7, 5),
}


def _reported(mib: int, where: str) -> str:
    return f"total_memory {mib:,} MiB as torch reports it ({where}); the driver's figure moves by ~0.5 %"


#: The presets of ``forecast(device=...)``: total_memory as torch printed it in public logs
#: (``torch.cuda.get_device_properties`` or Ultralytics' ``CUDA:0 (name, N MiB)``, which is
#: total_memory / 2**20) with recent drivers; the context as ``CUDA_CONTEXT_BYTES`` says.
DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device(
            "A100-40GB",
            40441 * MIB,
            CUDA_CONTEXT_BYTES,
            _reported(40441, "A100-SXM4-40GB, torch 2.11, CUDA 12.8"),
        ),
        Device(
            "A100-80GB",
            81153 * MIB,
            CUDA_CONTEXT_BYTES,
            _reported(81153, "A100-SXM4-80GB, torch 2.7, CUDA 12.6"),
        ),
        Device(
            "H100-80GB", 81559 * MIB, CUDA_CONTEXT_BYTES, _reported(81559, "H100 80GB HBM3, 85,520,809,984 B")
        ),
        Device(
            "H100-94GB", 95320 * MIB, CUDA_CONTEXT_BYTES, _reported(95320, "H100 NVL, torch 2.13, CUDA 13.0")
        ),
        Device(
            "H200-141GB", 143156 * MIB, CUDA_CONTEXT_BYTES, _reported(143156, "H200, torch 2.11, CUDA 12.8")
        ),
        Device("L4-24GB", 22563 * MIB, CUDA_CONTEXT_BYTES, _reported(22563, "L4, torch 2.11, CUDA 12.8")),
        Device("A10G-24GB", 22587 * MIB, CUDA_CONTEXT_BYTES, _reported(22587, "A10G")),
        Device("RTX4090-24GB", 24563 * MIB, CUDA_CONTEXT_BYTES, _reported(24563, "GeForce RTX 4090")),
        Device("V100-16GB", 16160 * MIB, CUDA_CONTEXT_BYTES, _reported(16160, "V100-SXM2-16GB")),
        Device("V100-32GB", 32494 * MIB, CUDA_CONTEXT_BYTES, _reported(32494, "V100-SXM2-32GB, torch 2.6")),
        Device(
            "T4-16GB", 15095 * MIB, CUDA_CONTEXT_BYTES, _reported(15095, "Tesla T4, torch 2.6, CUDA 12.4")
        ),
        Device("MI300X-192GB", 196592 * MIB, ROCM_CONTEXT_BYTES, _reported(196592, "MI300X, ROCm")),
    )
}

#: The preset a forecast is for when no device is named.
DEFAULT_DEVICE = "A100-80GB"

#: Dense (non-sparse) bf16/fp16 tensor-core peak FLOP/s of one GPU, from the vendors'
#: datasheets (their headline figures are often the 2:4-sparsity ones, twice these), by a
#: pattern of the name torch gives the device. The first pattern that matches wins, so
#: variants come before the family.
PEAK_FLOPS_PER_S: tuple[tuple[str, float], ...] = (
    (r"H100.*PCIe", 756e12),
    (r"H[12]00.*NVL", 835e12),
    (r"H100", 989e12),
    (r"H200", 989e12),
    (r"A100", 312e12),
    (r"L40S", 362e12),
    (r"\bL4\b", 121e12),
    (r"\bA10G?\b", 125e12),
    (r"V100", 125e12),
    (r"\bT4\b", 65e12),
    (r"RTX 4090(?! D)", 165e12),
    (r"RTX 3090(?! Ti)", 71e12),
)

_CAPACITY = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?", flags=re.IGNORECASE)


def peak_flops_per_s(device_name: str) -> float | None:
    """Dense bf16/fp16 tensor-core peak FLOP/s of a GPU named like ``torch.cuda.get_device_name``
    (``"NVIDIA H100 80GB HBM3"``); None for a device not in ``PEAK_FLOPS_PER_S``."""
    for pattern, peak in PEAK_FLOPS_PER_S:
        if re.search(pattern, device_name):
            return peak
    return None


def is_capacity(text: str) -> bool:
    """Whether ``text`` is a capacity (``"80GB"``, ``"24GiB"``, a number of bytes) rather
    than a preset's name."""
    return _CAPACITY.fullmatch(text) is not None


def resolve_device(device: str | float) -> Device:
    """A preset by name (case and dashes ignored; a unique prefix such as ``"A10G"`` will do),
    ``"cpu"`` (this machine's, ``cpu_device``), a capacity in bytes, or a string ``"80GB"`` (decimal) / ``"24GiB"`` (binary). Anything
    else, and a capacity of 0, is a ``ConfigError`` naming ``device``."""
    if isinstance(device, (int, float)) and not isinstance(device, bool):
        return _custom(_capacity(device, device), f"{int(device):,} bytes as given")
    text = str(device).strip()
    size = _CAPACITY.fullmatch(text)
    if size:
        unit = (size.group(2) or "B").upper().replace("IB", "iB")
        scale = {"B": 1, **{f"{p}B": 1000**i for i, p in enumerate("KMGT", 1)}}
        scale.update({f"{p}iB": 1024**i for i, p in enumerate("KMGT", 1)})
        return _custom(_capacity(float(size.group(1)) * scale[unit], device), f"{text} as given")

    def key(name: str) -> str:
        return re.sub(r"[\s_-]", "", name).lower()

    wanted = key(text)
    if wanted == "cpu":
        return cpu_device()
    found = [d for d in DEVICES.values() if key(d.name) == wanted]
    if not found and wanted:
        found = [d for d in DEVICES.values() if key(d.name).startswith(wanted)]
    if len(found) == 1:
        return found[0]
    raise ConfigError(
        "device",
        f"must be one of {', '.join(DEVICES)}, cpu, a number of bytes or a capacity such as 80GB or 24GiB",
        device,
    )


def cpu_device() -> Device:
    """This machine's CPU as a forecast's target: its physical memory, no context, the
    CPU's implementations (``device="cpu"``)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Device("CPU", int(total), 0, f"this machine's physical memory, {fmt_bytes(total)}", "cpu")


def _capacity(capacity: float, given: Any) -> float:
    if not (capacity > 0 and math.isfinite(capacity)):
        raise ConfigError(
            "device",
            f"must be a capacity above 0, such as 80GB or 24GiB (or a number of bytes), or one of {', '.join(DEVICES)}",
            given,
        )
    return capacity


def _custom(capacity: float, source: str) -> Device:
    return Device(f"{fmt_bytes(capacity)} device", int(capacity), CUDA_CONTEXT_BYTES, source)


class Price(NamedTuple):
    """What one device costs to rent: ``usd_per_hour`` for one GPU, ``source`` and
    ``as_of`` (when the figure was read) say where it comes from."""

    usd_per_hour: float
    source: str
    as_of: str


_MERCATUS = "on-demand, specialty clouds' range midpoint, mercatus-ai.com/blog/cloud-gpu-pricing"

#: On-demand rent of one GPU, by a pattern of the name torch (or a trace's
#: ``deviceProperties``) gives it; the first pattern that matches wins. Published list prices
#: move monthly and differ 2–4x between providers: set your own with
#: ``PRICES_PER_HOUR.insert(0, (pattern, Price(...)))``, ``$SWIFT_NB_PRICE_PER_HOUR`` or the
#: ``price_per_hour`` option of each front. A GPU not listed (and a CPU run) has no default price.
PRICES_PER_HOUR: list[tuple[str, Price]] = [
    (r"H200", Price(4.00, f"$3.50–4.50 {_MERCATUS}", "2026-05")),
    (r"H100", Price(3.00, f"$2.50–3.50 {_MERCATUS}", "2026-05")),
    (r"A100.*80\s?GB", Price(1.30, f"$1.10–1.50 {_MERCATUS}", "2026-05")),
    (r"A100", Price(1.30, f"the A100 80GB's $1.10–1.50 {_MERCATUS} (40GB not listed there)", "2026-05")),
]

#: The environment variable that sets the price of one device-hour (USD) for every run.
ENV_PRICE_PER_HOUR = "SWIFT_NB_PRICE_PER_HOUR"
#: ... and of one kWh, for ``energy_cost_usd``.
ENV_PRICE_PER_KWH = "SWIFT_NB_PRICE_PER_KWH"


def price_of(device_name: str) -> Price | None:
    """The table's rent of one GPU named like ``torch.cuda.get_device_name``; None when
    ``PRICES_PER_HOUR`` has no pattern for it."""
    for pattern, price in PRICES_PER_HOUR:
        if re.search(pattern, device_name):
            return price
    return None


def check_price(name: str, value: Any) -> float | None:
    """``value`` as a price (a number ≥ 0), or None; a ``ConfigError`` naming ``name``
    otherwise. Raised at the edge, before any work."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(name, "must be a price in USD, a number such as 2.5", value) from None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (value >= 0 and math.isfinite(value))
    ):
        raise ConfigError(name, "must be a price in USD, a number ≥ 0 such as 2.5", value)
    return float(value)
