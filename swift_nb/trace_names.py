"""What the events of a torch.profiler trace are called, and arithmetic on their spans.

The one place that knows the trace's vocabulary: the profiler's step spans, swift_nb's own
events, the collectives and their kinds, the events each part of the step breakdown is made
of; and unions, differences and clipping of time intervals, which turn those events into
seconds of collective time and of exposed communication. Imports only the standard library
and numpy, so the capture layer (which records traces) and the analysis layer (which reads
them) share it.

Intervals are half-open (start, end) rows of an ``(n, 2)`` float array, in the trace's
microseconds; "disjoint sorted" ones are what ``union`` returns.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

# -- steps ------------------------------------------------------------------------------

STEP_PREFIX = "ProfilerStep#"  # the profiler's span of step k is named ProfilerStep#k
STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")


def step_of(name: str) -> int | None:
    """The step number of a profiler step span's name (``ProfilerStep#12`` → 12); None for
    every other event."""
    m = STEP_NAME.match(name)
    return int(m.group(1)) if m else None


# -- swift_nb's own work ------------------------------------------------------------------

OWN_PREFIX = "swift_nb#"  # record_function names of swift_nb's bookkeeping inside a step
OWN = re.compile("^" + re.escape(OWN_PREFIX))

# -- what the step breakdown tells apart ------------------------------------------------------

DATA = re.compile(r"^enumerate\(DataLoader\)")
WORKER_LOADER = "_MultiProcessingDataLoaderIter"  # in a DATA span's name: batches come from workers
COLLATE_STACK = "aten::stack"  # the default collate stacks each field of the samples
OPTIMIZER = re.compile(r"^Optimizer\.(?:step|zero_grad)#")
OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")
AUTOGRAD_PREFIX = "autograd::engine::evaluate_function"  # the engine running one backward node
BACKWARD = re.compile("^" + re.escape(AUTOGRAD_PREFIX) + r"|Backward\d*$")
COPY = re.compile(r"cudaMemcpy|Memcpy HtoD|Memcpy DtoH|hipMemcpy")
DDP_PREFIX = "DistributedDataParallel."
FSDP_PREFIX = "FSDP::"
# Categories of events on a device's timeline (all others run on a host thread).
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # a device stream busy

# -- communication ------------------------------------------------------------------------

# Communication as the step breakdown counts it: the collectives and FSDP's annotations
# around them (its copy-in/out work included).
COMMUNICATION = re.compile(
    r"^(?:c10d::|gloo:|nccl|record_param_comms|FSDP::|ProcessGroup|_all_to_all|all_reduce|broadcast)",
    re.I,
)
# The collectives themselves: the op the training thread issues (``c10d::…``), the
# backend's annotations and transfers (``gloo:…``, ``nccl:…``, NCCL kernels), the
# profiler's ``record_param_comms``; not FSDP's copy-in/out work.
COLLECTIVE = re.compile(r"^(?:c10d::|gloo:|nccl|record_param_comms|ProcessGroup)", re.I)
COLLECTIVE_CATEGORIES = ("cpu_op", "user_annotation", "kernel")
# A collective's transfer, whose duration includes waiting for the slowest peer: gloo's
# work on its own threads, an NCCL kernel on the device.
TRANSFER = re.compile(r"^(?:gloo:|nccl(?:Dev)?Kernel)", re.I)

_KIND_WORD = re.compile(r"^(?:c10d::|gloo:|nccl:)(\w+)$|^nccl(?:Dev)?Kernel_([A-Za-z]+)")
# The operation's word, lower case without underscores → its kind.
_KINDS = {
    "allreduce": "all_reduce",
    "allreducecoalesced": "all_reduce",
    "allgather": "all_gather",
    "allgatherbase": "all_gather",
    "allgathercoalesced": "all_gather",
    "allgatherintotensorcoalesced": "all_gather",
    "reducescatter": "reduce_scatter",
    "reducescatterbase": "reduce_scatter",
    "reducescattertensorcoalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "alltoall": "all_to_all",
    "alltoallbase": "all_to_all",
    "send": "send_recv",
    "recv": "send_recv",
    "recvanysource": "send_recv",
    "sendrecv": "send_recv",
    "barrier": "barrier",
    "monitoredbarrier": "barrier",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
}


def collective_kind(name: str) -> str | None:
    """The kind of collective an event belongs to (``all_reduce``, ``all_gather``,
    ``reduce_scatter``, ``broadcast``, ``all_to_all``, ``send_recv``, ``barrier``,
    ``reduce``, ``gather``, ``scatter``), from the issued op (``c10d::_reduce_scatter_base_``),
    the backend's annotation (``gloo:all_reduce``, ``nccl:_all_gather_base``) or the NCCL
    kernel (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``); None for any other name. NCCL
    runs all-to-all as send/receive kernels, so those kernels say ``send_recv``."""
    m = _KIND_WORD.match(name)
    if m is None:
        return None
    return _KINDS.get((m.group(1) or m.group(2)).replace("_", "").lower())


def collective_mask(names: Sequence[str], cats: Sequence[str]) -> np.ndarray:
    """Which events are collectives (issued op, annotation, transfer or kernel)."""
    hit = {n: bool(COLLECTIVE.match(n)) for n in set(names)}
    ok = set(COLLECTIVE_CATEGORIES)
    return np.fromiter((c in ok and hit[n] for n, c in zip(names, cats, strict=True)), bool, len(names))


def compute_mask(names: Sequence[str], cats: Sequence[str]) -> np.ndarray:
    """Which events are device compute that can hide a collective: GPU kernels that are
    not collectives. A CPU run has none: gloo's collectives run on the cores the
    backward needs, so running at the same time as host ops hides nothing."""
    hit = {n: bool(COLLECTIVE.match(n)) for n in set(names)}
    return np.fromiter(
        (c == "kernel" and not hit[n] for n, c in zip(names, cats, strict=True)), bool, len(names)
    )


# -- intervals ----------------------------------------------------------------------------


def union(starts, ends) -> np.ndarray:
    """Merge intervals into a sorted, disjoint (n, 2) array."""
    if len(starts) == 0:
        return np.empty((0, 2))
    order = np.argsort(starts, kind="stable")
    s, e = np.asarray(starts, float)[order], np.asarray(ends, float)[order]
    out = []
    cur_s, cur_e = s[0], e[0]
    for a, b in zip(s[1:], e[1:], strict=True):
        if a <= cur_e:
            cur_e = max(cur_e, b)
        else:
            out.append((cur_s, cur_e))
            cur_s, cur_e = a, b
    out.append((cur_s, cur_e))
    return np.array(out)


def length(iv: np.ndarray) -> float:
    """Summed length of disjoint intervals."""
    return float((iv[:, 1] - iv[:, 0]).sum()) if len(iv) else 0.0


def subtract(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Parts of disjoint sorted intervals ``a`` not covered by disjoint sorted ``b``."""
    if not len(a) or not len(b):
        return a
    out, j = [], 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            if cur >= e:
                break
            k += 1
        if cur < e:
            out.append((cur, e))
    return np.array(out) if out else np.empty((0, 2))


def clip(iv: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Intervals cut to [lo, hi); those left empty dropped."""
    if not len(iv):
        return iv
    c = np.clip(iv, lo, hi)
    return c[c[:, 1] > c[:, 0]]


def covered(spans: np.ndarray, iv: np.ndarray) -> np.ndarray:
    """For each row (start, end) of ``spans``, the length of disjoint sorted ``iv`` inside it."""
    return np.array([length(clip(iv, a, b)) for a, b in np.asarray(spans, float).reshape(-1, 2)])


def _spans(a) -> np.ndarray:
    return np.asarray(a, float).reshape(-1, 2)


def collective_us(steps, collectives) -> np.ndarray:
    """Collective time per step: for each step span, µs inside at least one collective
    span (on any thread or device; overlapping collectives count once)."""
    c = _spans(collectives)
    return covered(steps, union(c[:, 0], c[:, 1]))


def exposed_comm_us(steps, collectives, compute) -> np.ndarray:
    """Exposed communication per step: for each step span, µs inside a collective span
    and inside no compute span (the collective time that overlapping compute does not
    hide)."""
    c, k = _spans(collectives), _spans(compute)
    return covered(steps, subtract(union(c[:, 0], c[:, 1]), union(k[:, 0], k[:, 1])))
