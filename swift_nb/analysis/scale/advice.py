"""What would make a data-parallel step scale, each fix priced by the model that found the
problem (``model``): for a forecast row whose efficiency is under ``EFFICIENCY_FLOOR``, the
same row again with bf16 gradient reduction, with FSDP and bf16 reduction, at the best
bucket size, and with gradients accumulated over k micro-batches before they are reduced;
for a measured job, communication inside the optimizer's step (the seeds' master-weight
synchronisation) too."""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd

from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.ranks import straggler_finding
from swift_nb.analysis.scale.measured import Job
from swift_nb.analysis.scale.model import Basis, Step, efficiency, predict
from swift_nb.core.links import Link

EFFICIENCY_FLOOR = 0.70
EXPOSED_CEILING = 0.20  # a measured job's exposed communication, as a share of its step
BUCKETS_MB = (1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0)
ACCUMULATION = (2, 4, 8, 16, 32)


def _eff(basis: Basis, step: Step) -> float:
    return efficiency(basis.step_s, step.step_s)


def fixes(
    basis: Basis, layout: str, link: Link, n: int, bucket_mb: float, comm_bytes: float | None
) -> list[tuple[str, float, str]]:
    """(fix, predicted efficiency, how to apply it) for one configuration, best first."""
    now = predict(basis, layout, link, n, bucket_mb, comm_bytes)
    stored = float(basis.backward.grads["dtype_bytes"].iloc[0])
    out = []
    if (comm_bytes or stored) > 2:
        bf16 = predict(basis, layout, link, n, bucket_mb, 2.0)
        how = (
            "ddp.register_comm_hook(None, torch.distributed.algorithms.ddp_comm_hooks.default_hooks.bf16_compress_hook)"
            if layout == "ddp"
            else "fully_shard(..., mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.bfloat16))"
        )
        out.append(("reduce the gradients in bf16", _eff(basis, bf16), how))
    if layout == "ddp":
        sharded = predict(basis, "fsdp", link, n, bucket_mb, 2.0)
        out.append(
            (
                "FSDP with bf16 reduction",
                _eff(basis, sharded),
                "fully_shard each block, then the model, with MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)",
            )
        )
        best = max(BUCKETS_MB, key=lambda mb: _eff(basis, predict(basis, layout, link, n, mb, comm_bytes)))
        if best != bucket_mb:
            got = _eff(basis, predict(basis, layout, link, n, best, comm_bytes))
            out.append(
                (f"buckets of {best:g} MiB", got, f"DistributedDataParallel(..., bucket_cap_mb={best:g})")
            )
    for k in ACCUMULATION:
        # k micro-batches per optimizer step, the gradients reduced once: k × the compute, once the exposed comm
        acc = replace(basis, step_s=basis.step_s * k)
        step_k = predict(acc, layout, link, n, bucket_mb, comm_bytes)
        eff = k * basis.step_s / step_k.step_s
        if eff >= 0.9 or k == ACCUMULATION[-1]:
            out.append(
                (
                    f"accumulate gradients over {k} micro-batches",
                    eff,
                    f"{'model.no_sync()' if layout == 'ddp' else 'model.set_requires_gradient_sync(False)'} "
                    f"on {k - 1} of every {k} backward passes ({k} × the samples per optimizer step)",
                )
            )
            break
    out = [f for f in out if f[1] > _eff(basis, now) * 1.02]
    return sorted(out, key=lambda f: -f[1])


def forecast_findings(
    table: pd.DataFrame, basis: Basis, link: Link, bucket_mb: float, comm_bytes: float | None
) -> list[Finding]:
    """One finding per layout, at its smallest world size whose forecast efficiency is
    under ``EFFICIENCY_FLOOR``."""
    found = []
    for layout, rows in table.groupby("layout", sort=False):
        low = rows[(rows["efficiency"] < EFFICIENCY_FLOOR) & (rows["world_size"] > 1)]
        if low.empty:
            continue
        r = low.sort_values("world_size").iloc[0]
        n = int(r["world_size"])
        options = fixes(basis, str(layout), link, n, bucket_mb, comm_bytes)
        if not options:
            continue
        best = options[0]
        said = "; ".join(f"{name}: {eff:.0%} ({how})" for name, eff, how in options)
        found.append(
            Finding(
                id="scaling",
                title=f"{str(layout).upper()} over {n} ranks of {link.name}: {r['efficiency']:.0%} efficiency forecast",
                evidence={
                    "world_size": n,
                    "layout": str(layout),
                    "link": link.name,
                    "efficiency": float(r["efficiency"]),
                    "exposed_comm_s": float(r["exposed_comm_s"]),
                    "step_s": float(r["step_s"]),
                    "why": str(r["why"]),
                },
                suggestion=f"Forecast by the same model: {said}.",
                predicted_effect=f"efficiency {r['efficiency']:.0%} → {best[1]:.0%} ({best[0]})",
                formula="the same α–β link and backward timing as the row, with the fix applied",
                severity="critical" if r["efficiency"] < 0.5 else "warning",
            )
        )
    return found


def optimizer_sync(collectives: pd.DataFrame, step_s: float) -> Finding | None:
    """A measured job whose collectives run inside ``Optimizer.step`` for more than
    ``EXPOSED_CEILING`` of its step: master weights or gradients synchronised in the
    optimizer, where nothing overlaps them — FSDP with mixed precision shards that work."""
    if collectives is None or collectives.empty or "optimizer_share" not in collectives or not step_s:
        return None
    inside = float((collectives["time_s_per_step"] * collectives["optimizer_share"].fillna(0)).sum())
    if not (inside / step_s >= EXPOSED_CEILING) or math.isnan(inside):
        return None
    return Finding(
        id="optimizer_sync",
        title=f"Communication inside the optimizer's step: {inside / step_s:.0%} of the step",
        evidence={"optimizer_comm_s_per_step": inside, "step_s": step_s},
        suggestion=(
            "Synchronising fp32 master weights or gradients inside optimizer.step() overlaps nothing: shard them with "
            "FSDP (fully_shard with MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)), "
            "whose reduce-scatter runs during the backward and whose optimizer updates 1/N of the weights"
        ),
        predicted_effect=f"up to {inside / step_s:.0%} of the step",
        time_cut=inside / step_s,
        time_cut_bound=True,
        severity="warning",
    )


def job_findings(
    job: Job, basis: Basis, link: Link, bucket_mb: float, comm_bytes: float | None
) -> list[Finding]:
    """A measured job's: exposed communication over ``EXPOSED_CEILING`` of its step (the
    fixes priced at its world size), collectives inside the optimizer's step, a straggler."""
    found = []
    share = job.exposed_comm_s / job.step_s if job.step_s else 0.0
    options = (
        fixes(basis, job.layout, link, job.world_size, bucket_mb, comm_bytes)
        if share > EXPOSED_CEILING
        else []
    )
    if options:
        said = "; ".join(f"{name}: {eff:.0%} ({how})" for name, eff, how in options)
        found.append(
            Finding(
                id="scaling",
                title=f"The {job.world_size}-rank {job.layout.upper()} job: exposed communication {share:.0%} of its step",
                evidence={
                    "world_size": job.world_size,
                    "layout": job.layout,
                    "exposed_comm_s": job.exposed_comm_s,
                    "step_s": job.step_s,
                    "measured_efficiency": efficiency(basis.step_s, job.step_s),
                },
                suggestion=f"Forecast for this job by the model of swift_nb.scale: {said}.",
                predicted_effect=f"efficiency {efficiency(basis.step_s, job.step_s):.0%} measured → {options[0][1]:.0%} ({options[0][0]})",
                formula="the α–β link and the one-process run's backward timing, with the fix applied",
                severity="critical" if share >= 0.5 else "warning",
            )
        )
    sync = optimizer_sync(job.collectives, job.step_s)
    if sync is not None:
        found.append(sync)
    if len(job.ranks) and "straggler" in job.ranks:
        late = straggler_finding(job.ranks, job.collectives)
        if late is not None:
            found.append(late)
    return found
