"""What the events of a torch.profiler trace are called, and arithmetic on their spans.

The one place that knows the trace's vocabulary: the profiler's step spans, swift_nb's own
events, the collectives and their kinds, the events each part of the step breakdown is made
of, the kinds of device kernels; and unions, intersections, differences and clipping of time
intervals (numpy throughout, no loop over events), which turn those events into seconds of
collective time, exposed communication and device idle time. Imports only the standard library
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
#: a module's forward in a recorded step (swift_nb.capture.memory.modules): the prefix, then its path
MODULE_PREFIX = "module: "
OWN = re.compile("^" + re.escape(OWN_PREFIX))
#: a zero-length event naming storages of the loss's logits just made, by their addresses in
#: hex, comma-separated (``capture.memory.logits``)
LOGITS_MARK = OWN_PREFIX + "logits "


def logits_addresses(name: str) -> list[int]:
    """The addresses a ``LOGITS_MARK`` event names (none for any other name)."""
    if not name.startswith(LOGITS_MARK):
        return []
    try:
        return [int(h, 16) for h in name[len(LOGITS_MARK) :].split(",") if h]
    except ValueError:
        return []


# -- what the step breakdown tells apart ------------------------------------------------------

DATA = re.compile(r"^enumerate\(DataLoader\)")
# A user annotation around loading the next batch (``record_function("## data_load ##")``)
DATA_ANNOTATION = re.compile(r"data[ _]?load", re.IGNORECASE)
# Runtime calls that block the host until the device has drained: the next kernel can only
# be launched after them, so the device idles from their end until the next launch.
SYNC = re.compile(r"^(?:cuda|hip)(?:Device|Stream|Event)Synchronize$")
# Runtime calls that copy between host and device; a copy from pageable memory blocks the
# host while it stages the data.
MEMCPY_CALL = re.compile(r"^(?:cuda|hip)Memcpy")
# A copy between pageable host memory and the device (the host stages it, synchronously)
PAGEABLE_COPY = re.compile(r"Memcpy (?:HtoD|DtoH) \((?:Pageable -> Device|Device -> Pageable)\)")
# An fp32 GEMM on the CUDA cores, not the tensor cores (cuBLAS's SIMT sgemm kernels)
SIMT_SGEMM = re.compile(r"(?<![a-z])(?:maxwell|pascal|volta|turing|ampere|sm\d+)_sgemm|^sgemm", re.IGNORECASE)
# The runtime calls that put work on the device.
LAUNCH = re.compile(
    r"^(?:cuda|hip)(?:LaunchKernel|LaunchCooperativeKernel|Memcpy|Memset|GraphLaunch)|^cuLaunchKernel"
)
# -- compiled code (torch.compile), as torch 2.13 names it in a trace --------------------------
# The spans compiled code runs inside: dynamo's compiled frame (``Torch-Compiled Region:
# 0/0``, its compile id), AOTAutograd's forward and backward (``CompiledFunction``,
# ``CompiledFunctionBackward`` and the autograd engine's span around the latter), and an
# Inductor graph's call (``## Call CompiledFxGraph <hash> ##``). Operators nested in them
# are compiled code too: on CPU, Inductor's C++ kernels are not profiler events themselves
# (unless its kernel profiling is on), so their time is the self time of these spans.
COMPILED_REGION = re.compile(
    r"^(?:Torch-Compiled Region: |CompiledFunction(?:Backward)?$|## Call CompiledFxGraph "
    r"|autograd::engine::evaluate_function: CompiledFunctionBackward$)"
)
# Inductor's generated kernels: Triton on GPU (triton_poi_/per_/red_/tem_…), C++ on CPU
# with inductor's cpp.enable_kernel_profile (``cpp_fused_…``, ``graph_0_cpp_fused_…``).
INDUCTOR_KERNEL = re.compile(r"^(?:triton_|(?:graph_\d+_)?cpp_fused_)")
# dynamo's own work around each call of a compiled frame: the guard checks of its cache
# lookup, the bytecode before the graph, AOTAutograd's prologue.
COMPILED_RUNTIME = re.compile(
    r"^(?:TorchDynamo Cache Lookup|Pregraph bytecode|AOTDispatcher Runtime Wrapper Prologue)$"
)


def is_compiled(name: str) -> bool:
    """Whether an event of this name is torch.compile's code (a region, a generated kernel,
    or dynamo's runtime around a call); what runs nested in a region is too."""
    return bool(COMPILED_REGION.match(name) or INDUCTOR_KERNEL.match(name) or COMPILED_RUNTIME.match(name))


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
# Host-side calls into the CUDA runtime and driver; a device event's ``correlation`` id is
# that of the call that launched it.
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
# Host events that are the host doing work (an operator, a runtime call), as opposed to
# annotations that only name a region (``## forward ##``, ``DistributedDataParallel.forward``).
HOST_WORK = ("cpu_op", "cuda_runtime", "cuda_driver")

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
# The profiler's op inside each c10d collective; it records the message's size, element
# type and process group size in its args.
PARAM_COMMS = "record_param_comms"
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


def is_collective(name: str) -> bool:
    """Whether an event of this name belongs to a collective (issued op, annotation,
    transfer or kernel)."""
    return COLLECTIVE.match(name) is not None


def collective_mask(named: np.ndarray, cats: Sequence[str]) -> np.ndarray:
    """Which events are collectives; ``named``: ``is_collective`` of each event's name
    (a bool array), ``cats``: each event's category."""
    return named & np.isin(np.asarray(cats, dtype=object), list(COLLECTIVE_CATEGORIES))


def compute_mask(named: np.ndarray, cats: Sequence[str]) -> np.ndarray:
    """Which events are device compute that can hide a collective: GPU kernels that are
    not collectives (``named`` and ``cats`` as for ``collective_mask``). A CPU run has
    none: gloo's collectives run on the cores the backward needs, so running at the same
    time as host ops hides nothing."""
    return ~named & (np.asarray(cats, dtype=object) == "kernel")


# -- device kernels ---------------------------------------------------------------------------

# What device work counts as compute, as HolisticTraceAnalysis (HTA) classifies it
# (hta/utils/utils.py, ``NCCL_COMPUTE_KERNEL_RE``): everything but NCCL kernels, memory
# copies and sets, and names that say ``Sync``. Kept verbatim so the percentages agree.
NOT_COMPUTE = re.compile(r"^nccl.*Kernel|.*Memcpy|Memset|.*Sync")
# A communication kernel: NCCL's, however a version names it (``ncclKernel_AllReduce_…``,
# ``ncclDevKernel_AllGather_…``); HTA's ``NCCL_KERNEL_RE``.
COMM_KERNEL = re.compile(r"^nccl.*Kernel")
# Host operators and annotations that wait for asynchronous work: c10d's and the functional
# collectives' waits (``record_param_comms`` of a ``wait`` is already a collective), and
# libraries' awaitables (``## KJTAllToAllSplitsAwaitable wait() ##``, ``All2All_Pooled_Wait``).
# In a training step what they wait for is a collective.
WAIT = re.compile(r"wait", re.I)

# Kinds of device work, first match wins, from the names that real CUDA traces carry.
KERNEL_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("communication", COMM_KERNEL),
    ("memcpy", re.compile(r"^(?:Memcpy|dma)")),  # Memcpy HtoD (Pinned -> Device), DtoD, DtoH
    ("memset", re.compile(r"^Memset")),
    # fused attention: FlashAttention (flash_fwd_kernel, flash::…), xformers/PyTorch
    # memory-efficient attention (fmha_cutlassF…, efficient_attention…), cuDNN SDPA
    ("attention", re.compile(r"flash_fwd|flash_bwd|flash::|fmha|attention|sdpa|_attn_", re.I)),
    # cuDNN and CUTLASS convolutions: implicit GEMMs named by pass (fprop, dgrad, wgrad),
    # Winograd, cuDNN's scudnn kernels and their offset set-up (cask_cudnn…computeOffsets)
    ("convolution", re.compile(r"conv|implicit_?gemm|winograd|wgrad|dgrad|fprop|scudnn|cask_cudnn", re.I)),
    # cuBLAS/cuBLASLt/CUTLASS matrix products (ampere_sgemm_…, sm90_xmma_gemm_…, nvjet_…,
    # cutlass::Kernel<…gemm…>, gemv, split-K reductions); not fbgemm's embedding kernels
    ("gemm", re.compile(r"(?<!fb)gemm|gemv|cublas|cutlass|xmma|nvjet|matmul|splitKreduce", re.I)),
    # embedding tables (fbgemm's split_embedding_…, permute_pooled_embs, index bounds)
    ("embedding", re.compile(r"embedding|embs_kernel|bounds_check_indices", re.I)),
    # PyTorch's elementwise and reduction kernels and their kin: normalisation, softmax,
    # pooling, concatenation, indexing, permutations, (de)quantisation, the fused
    # optimizer's multi_tensor_apply, CUB scans and sorts, cuDNN's layout and scale kernels
    (
        "elementwise/reduction",
        re.compile(
            r"elementwise|reduce|multi_tensor_apply|softmax|norm|bn_fw|bn_bw|GammaBeta|Moments"
            r"|pool|CatArray|index|scatter|gather|permute|quantize|FP8|cub::|_kernel_cuda|cudnn::ops::",
            re.I,
        ),
    ),
)
KERNEL_KIND_NAMES = (*(k for k, _ in KERNEL_KINDS), "other")


def kernel_kind(name: str) -> str:
    """The kind of a device event (``KERNEL_KIND_NAMES``) from its name: ``gemm``,
    ``convolution``, ``attention``, ``embedding``, ``elementwise/reduction``,
    ``communication``, ``memcpy``, ``memset``, or ``other``."""
    for kind, rx in KERNEL_KINDS:
        if rx.search(name):
            return kind
    return "other"


def is_compute(name: str) -> bool:
    """Whether a device event is compute by HTA's rule (``NOT_COMPUTE``)."""
    return NOT_COMPUTE.match(name) is None
