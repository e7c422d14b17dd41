"""One data-parallel layout's step at ``n`` ranks, from one process's measured step.

Every rank keeps the measured per-rank batch, so each rank computes what the one process
did; what changes is what the layout adds.

**DDP.** The gradients go into buckets in the order they become ready (DDP rebuilds its
buckets in that order after its first step): the first holds up to 1 MiB
(``dist._DEFAULT_FIRST_BUCKET_BYTES``), the others up to ``bucket_mb``. A bucket's all-reduce
is launched when its last gradient is ready, and the all-reduces run one after another.
Running beside compute (a GPU's own communication stream) a bucket's all-reduce runs under
the backward that is left; what it cannot hide is the time after the backward's end until
the last bucket is reduced (the last bucket is never hidden). The share of a collective that
cannot run beside compute (``1 − Link.overlap``: gloo's reduction on the CPU cores the
backward keeps busy) is waited for whole (``Link.exposed``).

**FSDP** (FSDP2's ``fully_shard`` per repeated block, then the root; ``units`` of them):
the parameters are all-gathered for the forward and again for the backward (resharded
after the forward), the gradients reduce-scattered, each in ``units`` collectives. The
optimizer updates 1/n of the parameters. Beside compute, FSDP prefetches the next
unit's all-gather under the current unit's compute: exposed are the first unit's all-gather,
the last unit's reduce-scatter, and whatever the communication needs beyond the forward and
backward it runs under; the share of the link that cannot run beside compute is exposed
whole, as for DDP.

Ranks that synchronise every step each wait for the slowest: a step of ``n`` ranks takes
the largest of ``n`` of the measured process's step times, expected over its steady steps
(``Basis.slowest_wait``: the jitter a shared machine, a GPU's clocks or the data adds, paid
by every rank).

Gradients reduced in another dtype (``grad_dtype``: bf16 all-reduce through DDP's
``bf16_compress_hook``, FSDP2's ``MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)``) send
that dtype's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from swift_nb.analysis.scale.backward import Backward
from swift_nb.core.links import Link

MIB = 1024**2
FIRST_BUCKET_BYTES = 1 * MIB  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
LAYOUTS = ("ddp", "fsdp")
DDP_PASSES = 3  # each gradient copied into its bucket, divided by the ranks, copied back


@dataclass(frozen=True)
class Basis:
    """What the one measured process says: its median step (s), its gradients in ready
    order (times as shares of the step), the bytes of its parameters (as stored), the
    number of FSDP units the model would have."""

    step_s: float
    backward: Backward
    units: int
    steps: tuple[float, ...] = ()  # the steady steps the median is of (s)

    @property
    def grad_bytes(self) -> float:
        return self.backward.grad_bytes

    def slowest_wait(self, n: int) -> float:
        """What each step of ``n`` synchronised ranks waits for the slowest one, beyond the
        median: the expected largest of ``n`` steps drawn from the measured ones, less
        their median (0 for one rank, or fewer than 3 steps measured)."""
        if n <= 1 or len(self.steps) < 3:
            return 0.0
        x = np.sort(np.asarray(self.steps, dtype=float))
        m = len(x)
        i = np.arange(1, m + 1)
        expected_max = float(np.sum(x * ((i / m) ** n - ((i - 1) / m) ** n)))
        return max(0.0, expected_max - float(np.median(x)))


@dataclass
class Step:
    """A layout's step at ``n`` ranks, in seconds, and its terms, largest first."""

    compute_s: float
    comm_s: float
    exposed_comm_s: float
    terms: dict[str, float] = field(default_factory=dict)
    collectives: int = 0

    @property
    def step_s(self) -> float:
        return self.compute_s + self.exposed_comm_s


def buckets(backward: Backward, bucket_mb: float) -> list[tuple[float, float]]:
    """(bytes, ready share) of each DDP bucket, in the order they are reduced."""
    cap: float = FIRST_BUCKET_BYTES
    out: list[tuple[float, float]] = []
    size, first = 0.0, True
    grads = backward.grads
    for nbytes, ready in zip(grads["bytes"].to_numpy(), grads["ready_share"].to_numpy(), strict=True):
        size += float(nbytes)
        if size >= cap:
            out.append((size, float(ready)))
            size = 0.0
            if first:
                cap, first = bucket_mb * MIB, False
    if size > 0:
        out.append((size, float(grads["ready_share"].iloc[-1])))
    return out


def ddp(basis: Basis, link: Link, n: int, bucket_mb: float, comm_dtype_bytes: float | None) -> Step:
    """DDP's step at ``n`` ranks (see the module's docstring)."""
    if n <= 1:
        return Step(basis.step_s, 0.0, 0.0, {"compute": basis.step_s})
    bw = basis.backward
    stored = float(bw.grads["dtype_bytes"].iloc[0])
    ratio = (comm_dtype_bytes / stored) if comm_dtype_bytes else 1.0
    plan = buckets(bw, bucket_mb)
    bf16 = (comm_dtype_bytes or stored) == 2
    cost = [link.seconds("all_reduce", b * ratio, n, bf16) for b, _ in plan]
    comm = float(sum(cost))
    end = 0.0
    for (_, ready), c in zip(plan, cost, strict=True):
        end = max(end, ready * basis.step_s) + c
    exposed = link.exposed(comm, max(0.0, end - bw.backward_end_share * basis.step_s))
    # the gradients copied into the buckets, averaged, copied back (a bf16 hook casts twice more)
    copies = link.copy_s((DDP_PASSES + (1 if ratio < 1 else 0)) * basis.grad_bytes)
    wait = basis.slowest_wait(n)
    terms = {
        "compute": basis.step_s,
        "gradient all-reduce": exposed,
        "bucket copies": copies,
        "waiting for the slowest rank": wait,
    }
    return Step(basis.step_s + copies + wait, comm, exposed, terms, len(plan))


def fsdp(basis: Basis, link: Link, n: int, comm_dtype_bytes: float | None) -> Step:
    """FSDP2's step at ``n`` ranks (see the module's docstring)."""
    bw = basis.backward
    optimizer_s = bw.optimizer_share * basis.step_s
    if n <= 1:
        return Step(basis.step_s, 0.0, 0.0, {"compute": basis.step_s})
    compute = basis.step_s - optimizer_s + optimizer_s / n
    params = basis.grad_bytes
    stored = float(bw.grads["dtype_bytes"].iloc[0])
    ratio = (comm_dtype_bytes / stored) if comm_dtype_bytes else 1.0
    u = max(1, basis.units)
    gather = 2 * u * link.seconds("all_gather", params / u, n, stored == 2)
    scatter = u * link.seconds("reduce_scatter", params * ratio / u, n, (comm_dtype_bytes or stored) == 2)
    comm = gather + scatter
    window = bw.backward_end_share * basis.step_s  # forward and backward
    edges = gather / (2 * u) + scatter / u
    exposed = link.exposed(comm, min(max(edges, comm - window + edges), comm))
    share = exposed / comm if comm else 0.0
    gather_exposed, scatter_exposed = gather * share, scatter * share
    # each all-gather copies the shard in and the whole out, the reduce-scatter the whole
    # gradients in and the shard out: 3 × (1 + 1/n) passes over the parameters' bytes
    copies = link.copy_s(3 * (1 + 1 / n) * params)
    wait = basis.slowest_wait(n)
    terms = {
        "compute": compute,
        "parameter all-gathers": gather_exposed,
        "gradient reduce-scatters": scatter_exposed,
        "shard copies": copies,
        "waiting for the slowest rank": wait,
    }
    return Step(compute + copies + wait, comm, exposed, terms, 3 * u)


def predict(
    basis: Basis, layout: str, link: Link, n: int, bucket_mb: float, comm_dtype_bytes: float | None
) -> Step:
    if layout == "ddp":
        return ddp(basis, link, n, bucket_mb, comm_dtype_bytes)
    return fsdp(basis, link, n, comm_dtype_bytes)


def why(step: Step, n: int, link: Link) -> str:
    """The one or two terms that cost the most, as shares of the step."""
    total = step.step_s
    if total <= 0:
        return ""
    ranked = sorted(((v, k) for k, v in step.terms.items() if v > 0), reverse=True)
    parts = [f"{k} {v / total:.0%}" for v, k in ranked[:2] if v / total >= 0.05 or k == "compute"]
    if n > 1 and step.comm_s > 0 and step.exposed_comm_s < step.comm_s * 0.5 and link.overlaps:
        parts.append(
            f"{1 - step.exposed_comm_s / step.comm_s:.0%} of the communication hidden under the backward"
        )
    return "; ".join(parts)


def efficiency(step_1: float, step_n: float) -> float:
    """Throughput at n ÷ (n × throughput at 1), every rank at the same per-rank batch."""
    return float(np.float64(step_1) / np.float64(step_n)) if step_n > 0 else float("nan")
