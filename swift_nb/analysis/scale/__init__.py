"""Will it scale? A step's time and efficiency at N ranks, from one measured process.

``scale(run, ...)`` reads the run's median step and, from its trace, when each gradient
became ready (``backward``); prices each layout's collectives on a link (``core.links``: presets
or ``swift_nb.measure_link()``) and what the backward can hide of them (``model``); and
takes the peak per rank from the memory forecast. A measured job (``measured=``) is set
beside its forecast (``measured``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from swift_nb.analysis.scale.advice import forecast_findings, job_findings
from swift_nb.analysis.scale.backward import Backward, backward_of
from swift_nb.analysis.scale.measured import Job, job_of
from swift_nb.analysis.scale.model import LAYOUTS, Basis, Step, efficiency, predict, why
from swift_nb.analysis.trace.tables import load_trace
from swift_nb.core.errors import ConfigError
from swift_nb.core.links import PRESETS, Link, check_link, link_of
from swift_nb.record import Run, step_durations

__all__ = ["COLUMNS", "PRESETS", "Backward", "Job", "Link", "backward_of", "job_of", "link_of", "scale"]

COLUMNS = [
    "world_size",
    "layout",
    "link",
    "compute_s",
    "comm_s",
    "exposed_comm_s",
    "step_s",
    "efficiency",
    "tokens_per_s",
    "peak_bytes",
    "fits",
    "why",
]
MEASURED_COLUMNS = ["measured_step_s", "measured_comm_s", "measured_exposed_comm_s", "measured_efficiency"]
GRAD_DTYPES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}


def _whole(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(name, f"must be a whole number of at least {least}", value)
    return value


def check(
    run: Any,
    world_sizes: Any,
    link: Any,
    layouts: Any,
    nodes: Any,
    network: Any,
    grad_dtype: Any,
    bucket_mb: Any,
    measured: Any,
) -> tuple[list[int], Link, list[str], float | None]:
    """Every argument of ``scale`` checked before any work: the world sizes, the link (with
    ``nodes`` and the ``network`` between them), the layouts and the rest."""
    if not isinstance(run, Run):
        raise ConfigError("run", "give a profiled run of one process (swift_nb.profile() or load_run)", run)
    if len(run.ranks) > 0:
        raise ConfigError("run", "give the one-process run; a job of several ranks goes in measured=", run.id)
    if not (run.summary.get("step_time_median_s") or 0) > 0:
        raise ConfigError("run", "has no step time: profile at least two steps of the training loop", run.id)
    sizes = (
        [world_sizes] if isinstance(world_sizes, int) and not isinstance(world_sizes, bool) else world_sizes
    )
    if not isinstance(sizes, (list, tuple)) or not sizes:
        raise ConfigError("world_sizes", "give one or more numbers of ranks, e.g. (1, 2, 4, 8)", world_sizes)
    sizes = [_whole("world_sizes", n, 1) for n in sizes]
    lay = [layouts] if isinstance(layouts, str) else list(layouts or ())
    if not lay or any(x not in LAYOUTS for x in lay):
        raise ConfigError("layouts", f"choose among {', '.join(LAYOUTS)}", layouts)
    chosen = check_link(link_of(link))
    if nodes is not None:
        _whole("nodes", nodes, 1)
        if nodes > 1:
            chosen = chosen.across(check_link(link_of(network, "network")))
            uneven = [n for n in sizes if n % nodes]
            if uneven:
                raise ConfigError(
                    "world_sizes", f"must be multiples of nodes={nodes} (each node the same ranks)", uneven
                )
    elif network is not None:
        raise ConfigError("network", "is the link between nodes: give nodes= too", network)
    comm_bytes = None
    if grad_dtype is not None:
        if str(grad_dtype).lower() not in GRAD_DTYPES:
            raise ConfigError("grad_dtype", f"choose among {', '.join(GRAD_DTYPES)}", grad_dtype)
        comm_bytes = float(GRAD_DTYPES[str(grad_dtype).lower()])
    if (
        isinstance(bucket_mb, bool)
        or not isinstance(bucket_mb, (int, float))
        or not math.isfinite(bucket_mb)
        or bucket_mb <= 0
    ):
        raise ConfigError(
            "bucket_mb", "must be a number of MiB above 0 (DDP's bucket_cap_mb, default 25)", bucket_mb
        )
    if measured is not None and (not isinstance(measured, Run) or len(measured.ranks) < 2):
        raise ConfigError(
            "measured", "give the record of a job of several ranks (its rank 0's folder)", measured
        )
    return sizes, chosen, lay, comm_bytes


def basis_of(run: Run) -> Basis:
    """The one-process run's terms: its median step, its gradients in ready order, its
    FSDP units (its repeated blocks and the root)."""
    backward = backward_of(load_trace(run), run.context.get("params"))
    if backward is None:
        raise ConfigError(
            "run",
            "its trace holds no gradient with its shape (torch::autograd::AccumulateGrad): profile "
            "with record_shapes on (the default) and let the profiler record a step with a backward",
            run.id,
        )
    blocks = (run.context.get("repeated_blocks") or {}).get("count") or 0
    steady, _ = step_durations(run.steps)
    return Basis(
        step_s=float(run.summary["step_time_median_s"]),
        backward=backward,
        units=int(blocks) + 1,
        steps=tuple(float(x) for x in steady),
    )


def _peak(run: Run, layout: str, n: int, device: str | None) -> tuple[float, Any]:
    from swift_nb.analysis.forecast import forecast

    try:
        toggles = ("fsdp",) if layout == "fsdp" and n > 1 else ()
        kwargs: dict[str, Any] = {"world_size": n} if n > 1 else {}
        fc = (
            forecast(run, device, toggles=toggles, **kwargs)
            if device
            else forecast(run, toggles=toggles, **kwargs)
        )
    except (ConfigError, ValueError, KeyError):
        return math.nan, None
    return float(fc.total_bytes), bool(fc.fits)


def _tokens(run: Run) -> float | None:
    tokens = run.summary.get("real_tokens_per_step") or run.summary.get("tokens_per_step")
    return float(tokens) if tokens else None


def _row(
    run: Run, basis: Basis, layout: str, link: Link, n: int, step: Step, device: str | None
) -> dict[str, Any]:
    tokens = _tokens(run)
    peak, fits = _peak(run, layout, n, device)
    return {
        "world_size": n,
        "layout": layout,
        "link": link.name,
        "compute_s": step.compute_s,
        "comm_s": step.comm_s,
        "exposed_comm_s": step.exposed_comm_s,
        "step_s": step.step_s,
        "efficiency": 1.0 if n == 1 else efficiency(basis.step_s, step.step_s),
        "tokens_per_s": tokens * n / step.step_s if tokens else None,
        "peak_bytes": peak,
        "fits": fits,
        "why": why(step, n, link),
    }


def scale(
    run: Run,
    world_sizes: int | Sequence[int] = (1, 2, 4, 8),
    link: str | Link = "nvlink4",
    layouts: str | Sequence[str] = LAYOUTS,
    *,
    nodes: int | None = None,
    network: str | Link | None = None,
    grad_dtype: str | None = None,
    bucket_mb: float = 25.0,
    device: str | None = None,
    measured: Run | None = None,
) -> pd.DataFrame:
    """How fast ``run``'s training step runs on N ranks, each at the run's per-rank batch.

    Args:
        run: a profiled run of one process (its median step and its trace).
        world_sizes: the numbers of ranks to forecast.
        link: the link between the ranks: a preset (``PRESETS``: nvlink4, nvlink5, pcie4,
            pcie5, ib-ndr) or a ``Link`` (``swift_nb.measure_link()``); the run's own
            measured link when it saved one and ``link`` is left as is.
        layouts: ``"ddp"`` and/or ``"fsdp"``.
        nodes: the job spread over that many nodes: ``link`` inside each, ``network``
            (default ``ib-ndr``) between them; the slower carries every ring.
        network: the link between nodes.
        grad_dtype: the dtype gradients are reduced in (``"bf16"``: DDP's
            ``bf16_compress_hook``, FSDP2's ``reduce_dtype``); default: as stored.
        bucket_mb: DDP's ``bucket_cap_mb``.
        device: the card for the peak per rank and ``fits`` (a forecast preset); default the
            memory forecast's.
        measured: a job of several ranks of the same loop: its row gets the measured step,
            communication, exposed communication and efficiency beside the forecast.

    Returns:
        One row per world size × layout (``COLUMNS``; with ``measured``, ``MEASURED_COLUMNS``
        too, filled on the job's row). ``table.attrs["findings"]``: what would make it scale
        where it does not (``advice``), each fix priced by the same model.

    Raises:
        ConfigError: a bad argument, before any work; a run whose trace has no gradients.
    """
    if link == "nvlink4" and isinstance(run, Run) and run.context.get("link"):
        link = Link.from_dict(run.context["link"])
    if nodes is not None and nodes > 1 and network is None:
        network = "ib-ndr"
    sizes, chosen, lay, comm_bytes = check(
        run, world_sizes, link, layouts, nodes, network, grad_dtype, bucket_mb, measured
    )
    job = job_of(measured) if measured is not None else None
    if job is not None and job.world_size not in sizes:
        sizes = sorted({*sizes, job.world_size})
    basis = basis_of(run)
    rows = []
    for layout in lay:
        for n in sizes:
            step = predict(basis, layout, chosen, n, float(bucket_mb), comm_bytes)
            rows.append(_row(run, basis, layout, chosen, n, step, device))
    table = pd.DataFrame(rows, columns=COLUMNS)
    findings = forecast_findings(table, basis, chosen, float(bucket_mb), comm_bytes)
    if job is not None:
        table = _beside(table, job, basis)
        findings += job_findings(job, basis, chosen, float(bucket_mb), comm_bytes)
    table.attrs["findings"] = findings
    return table


def _beside(table: pd.DataFrame, job: Job, basis: Basis) -> pd.DataFrame:
    for c in MEASURED_COLUMNS:
        table[c] = math.nan
    mine = (table["world_size"] == job.world_size) & (table["layout"] == job.layout)
    table.loc[mine, "measured_step_s"] = job.step_s
    table.loc[mine, "measured_comm_s"] = job.comm_s
    table.loc[mine, "measured_exposed_comm_s"] = job.exposed_comm_s
    table.loc[mine, "measured_efficiency"] = efficiency(basis.step_s, job.step_s)
    return table
