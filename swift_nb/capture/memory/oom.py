"""The post-mortem of an out-of-memory failure: what was in memory, and who asked for more.

When a profiled cell fails with an allocation failure (``torch.OutOfMemoryError`` on CUDA,
the CPU allocator's "can't allocate memory" ``RuntimeError``, Python's ``MemoryError``),
``post_mortem`` reads the failure's traceback while it is still alive:

- parameters, gradients and optimizer state: the same snapshot of what the optimizers hold
  that the per-step categories use (``memory_categories.snapshot``), plus the parameters
  of the models the failing frames hold that no optimizer knows (frozen ones); the models
  only alive in the kernel (``swift_nb.capture.memory.stale_models``) are ``other``;
- activations: the tensors the autograd graph saved for backward, walked from every tensor
  the failing frames hold (the graph is the one place they live);
- other: every other tensor those frames hold (the batch, outputs, temporaries), and on
  CUDA whatever the allocator has handed out beyond all of these;
- where: the step, the phase (data loading, forward, backward, optimizer) from the frames
  the failure went through, the module path of the deepest module running
  (``model.layers.7.attn``), and the operator's source line;
- the largest tensors with what made them; the request's size (from the error's message);
  the capacity it ran against (the device, ``RLIMIT_AS``, a cgroup limit or the machine's
  memory); on CUDA reserved-but-unallocated bytes and whether ``expandable_segments`` is on.

It allocates little (a few small dicts) and touches no tensor data, so it works in the
low-memory state right after the failure. Everything is best effort: a part that cannot be
read is left out, never raised over the user's own error.
"""

from __future__ import annotations

import linecache
import os
import re
from collections.abc import Collection, Iterable, Iterator
from types import FrameType, TracebackType
from typing import Any

import torch
from torch import nn

from swift_nb.capture import models as found_models
from swift_nb.capture.memory import categories as memcat
from swift_nb.record import MEMORY_CATEGORIES

_CPU_OOM = re.compile(r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)|out of memory", re.I)
_CPU_REQUEST = re.compile(r"you tried to allocate (\d+) bytes")
_CUDA_REQUEST = re.compile(r"[Tt]ried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)")
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
TOP_TENSORS = 10
SQUARE_MIN = 64  # an activation [.., T, T] with T at least this is taken for attention scores
_MAX_NODES = 200_000  # autograd nodes walked at most (a huge graph must not stall the save)


def is_oom(error: BaseException | None) -> bool:
    """Whether ``error`` is an allocation failure."""
    if error is None:
        return False
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and bool(_CPU_OOM.search(str(error)))


def requested_bytes(error: BaseException) -> int | None:
    """The size of the allocation that failed, as the error's message gives it."""
    text = str(error)
    if m := _CPU_REQUEST.search(text):
        return int(m.group(1))
    if m := _CUDA_REQUEST.search(text):
        return int(float(m.group(1)) * _UNITS[m.group(2)])
    return None


def _frames(tb: TracebackType | None) -> list[FrameType]:
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


class _Storages:
    """Bytes by category of distinct storages (the first category a storage is given wins)
    and the largest tensors."""

    def __init__(self) -> None:
        self.square_bytes = 0  # activations shaped [.., T, T]: attention scores and probabilities
        self.category: dict[int, str] = {}
        self.nbytes: dict[int, int] = {}
        self.tensors: dict[int, dict[str, Any]] = {}

    def add(self, t: Any, category: str, name: str = "", made_by: str = "") -> None:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        try:
            st = t.untyped_storage()
            ptr, size = st.data_ptr(), st.nbytes()
        except (RuntimeError, NotImplementedError):  # sparse, wrapper subclasses
            return
        if not ptr or ptr in self.tensors:
            if ptr and not self.tensors[ptr]["name"]:  # a name found later, for one met unnamed
                self.tensors[ptr].update(name=name, made_by=self.tensors[ptr]["made_by"] or made_by)
            return
        # a storage already counted (the optimizers' snapshot) keeps its category
        category = self.category.setdefault(ptr, category)
        self.nbytes.setdefault(ptr, size)
        if category == "activations" and t.dim() >= 3 and t.shape[-1] == t.shape[-2] >= SQUARE_MIN:
            self.square_bytes += size
        self.tensors[ptr] = {
            "bytes": size,
            "shape": list(t.shape),
            "dtype": str(t.dtype).removeprefix("torch."),
            "device": str(t.device),
            "category": category,
            "name": name,
            "made_by": made_by,
        }

    def by_category(self) -> dict[str, int]:
        out = dict.fromkeys(MEMORY_CATEGORIES, 0)
        for ptr, cat in self.category.items():
            out[cat] += self.nbytes[ptr]
        return out

    def top(self, n: int) -> list[dict[str, Any]]:
        return sorted(self.tensors.values(), key=lambda r: -r["bytes"])[:n]


def _module_paths(models: dict[str, nn.Module]) -> dict[int, str]:
    paths: dict[int, str] = {}
    for var, root in models.items():
        for sub, m in root.named_modules():
            paths.setdefault(id(m), f"{var}.{sub}" if sub else var)
    return paths


def _blocks(models: dict[str, nn.Module], module: str | None) -> tuple[int | None, int | None]:
    """The model's repeated blocks (its longest ModuleList) and how many of them the
    failing module's block is, counting it (``model.layers.7.attn`` → 8), or None."""
    longest: tuple[int, str] | None = None
    for var, root in models.items():
        for sub, m in root.named_modules(prefix=var):
            if isinstance(m, nn.ModuleList) and (longest is None or len(m) > longest[0]):
                longest = (len(m), sub)
    if longest is None or longest[0] < 2:
        return None, None
    n, prefix = longest
    found = re.match(re.escape(prefix) + r"\.(\d+)(?:\.|$)", module or "")
    return n, int(found.group(1)) + 1 if found else None


def _phase(frames: list[FrameType]) -> str:
    """Where in the step the failure happened, from the frames it went through."""
    for frame in reversed(frames):
        path, func = frame.f_code.co_filename, frame.f_code.co_name
        if os.sep + "autograd" + os.sep in path or (path.endswith("_tensor.py") and func == "backward"):
            return "backward"
        if os.sep + "optim" + os.sep in path:
            return "optimizer"
        if os.sep + os.path.join("utils", "data") + os.sep in path:
            return "data loading"
    return "forward"


def _source_line(frame: FrameType, lineno: int) -> str:
    return linecache.getline(frame.f_code.co_filename, lineno).strip()


def _saved_tensors(roots: Iterable[Any]) -> Iterator[tuple[Any, str]]:
    """(tensor, node name) of what the autograd graph reachable from ``roots`` saved."""
    stack = [fn for fn in roots if fn is not None]
    seen: set[int] = set()
    while stack and len(seen) < _MAX_NODES:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        name = type(node).__name__ if not hasattr(node, "name") else node.name()
        for attr in dir(node):
            if not attr.startswith("_saved_") and attr != "saved_tensors":
                continue
            try:
                value = getattr(node, attr)
            except (RuntimeError, AttributeError):  # freed by backward already
                continue
            for t in value if isinstance(value, (tuple, list)) else (value,):
                yield t, name
        for nxt, _ in getattr(node, "next_functions", ()) or ():
            if nxt is not None:
                stack.append(nxt)


def _capacity(cuda_device: torch.device | None) -> tuple[int | None, str]:
    """The memory the failing allocation ran against, and what that limit is."""
    if cuda_device is not None:
        try:
            total = int(torch.cuda.get_device_properties(cuda_device).total_memory)
        except Exception:
            return None, "device memory"
        try:  # a cap set with torch.cuda.set_per_process_memory_fraction is the limit the allocator hit
            fraction = float(torch.cuda.get_per_process_memory_fraction(cuda_device))
        except Exception:
            fraction = 1.0
        if 0 < fraction < 1:
            return int(total * fraction), f"this process's share of device memory ({fraction:g})"
        return total, "device memory"
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            return int(soft), "the process's address-space limit (RLIMIT_AS)"
    except (ImportError, OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            text = f.read().strip()
        if text.isdigit():
            return int(text), "the container's memory limit (cgroup memory.max)"
    except OSError:
        pass
    import psutil

    return int(psutil.virtual_memory().total), "the machine's memory"


def _cuda_device(storages: _Storages, error: BaseException) -> torch.device | None:
    on_cuda = isinstance(error, torch.OutOfMemoryError) or any(
        r["device"].startswith("cuda") for r in storages.tensors.values()
    )
    if not on_cuda or not torch.cuda.is_available():
        return None
    m = re.search(r"GPU (\d+)", str(error))
    return torch.device("cuda", int(m.group(1)) if m else torch.cuda.current_device())


def _cuda_state(device: torch.device, known: int) -> dict[str, Any]:
    allocated = int(torch.cuda.memory_allocated(device))
    reserved = int(torch.cuda.memory_reserved(device))
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + os.environ.get("PYTORCH_ALLOC_CONF", "")
    return {
        "allocated_bytes": allocated,
        "reserved_bytes": reserved,
        "fragmentation_bytes": max(0, reserved - allocated),
        "expandable_segments": "expandable_segments:true" in conf.replace(" ", "").lower(),
        "unattributed_bytes": max(0, allocated - known),
    }


def _count_optimizers(
    storages: _Storages, optimizers: list, models: dict[str, nn.Module], stale: Collection[int] = ()
) -> None:
    """Parameters (trained and frozen), gradients and optimizer state: the snapshot's
    bytes, with names; the parameters and buffers of the models in ``stale`` (ids) are
    ``other``."""
    used = [m for m in models.values() if id(m) not in stale]
    alive = [m for m in models.values() if id(m) in stale]
    for ptr, (cat, size) in memcat.snapshot(optimizers, used, stale=alive).items():
        storages.category[ptr], storages.nbytes[ptr] = cat, size
    names = {id(p): n for var, m in models.items() for n, p in m.named_parameters(prefix=var)}
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                storages.add(p, "parameters", names.get(id(p), ""), "parameter")
                storages.add(p.grad, "gradients", names.get(id(p), "") + ".grad", "backward")
        for p, state in opt.state.items():
            for key, t in state.items():
                storages.add(
                    t, "optimizer_state", f"{names.get(id(p), 'state')}[{key!r}]", type(opt).__name__
                )
    for var, model in models.items():  # parameters no optimizer holds (frozen ones)
        category, made_by = (
            ("other", "alive in the kernel") if id(model) in stale else ("frozen_parameters", "")
        )
        for pname, p in model.named_parameters(prefix=var):
            storages.add(p, category, pname, made_by or "parameter")
            storages.add(p.grad, "gradients", f"{pname}.grad", "backward")
        for bname, b in model.named_buffers(prefix=var):
            storages.add(b, category, bname, made_by or "buffer")


def _location(tb: TracebackType | None, paths: dict[int, str]) -> dict[str, str | None]:
    """The deepest module running (its path), the deepest line of the user's own code,
    and the deepest source line (the operator that asked)."""
    module = where = op = None
    while tb is not None:
        frame, lineno = tb.tb_frame, tb.tb_lineno
        owner = frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and id(owner) in paths:
            module = paths[id(owner)]
        if not found_models.is_library(frame):
            where = f"{frame.f_code.co_filename}:{lineno} in {frame.f_code.co_name}"
        op = _source_line(frame, lineno) or op
        tb = tb.tb_next
    return {"module": module, "where": where, "op": op}


def _held(frames: list[FrameType], paths: dict[int, str]) -> list[tuple[torch.Tensor, str, str]]:
    """The tensors the frames hold (name, and the module or function holding it), the
    deepest frame first."""
    held = []
    for frame in reversed(frames):
        owner = frame.f_locals.get("self")
        made_by = frame.f_code.co_name
        if isinstance(owner, nn.Module):
            made_by = paths.get(id(owner), made_by)
        for name, v in found_models.values(frame, with_globals=not found_models.is_library(frame)):
            if isinstance(v, torch.Tensor):
                held.append((v, name, made_by))
    return held


def post_mortem(
    error: BaseException,
    *,
    step: int,
    optimizers: Iterable[torch.optim.Optimizer] = (),
    stale: Iterable[nn.Module] = (),
) -> dict:
    """What was in memory when ``error`` (an allocation failure) was raised in ``step``,
    as plain data (see the module's docstring; ``swift_nb.record.OutOfMemory`` holds it).
    ``stale``: root models only alive in the kernel (their weights are ``other``)."""
    frames = _frames(error.__traceback__)
    optimizers = list(optimizers)
    models = found_models.in_frames(frames)
    paths = _module_paths(models)
    for frame in frames:
        for _, v in found_models.values(frame, with_globals=False):
            if isinstance(v, torch.optim.Optimizer) and all(v is not o for o in optimizers):
                optimizers.append(v)
    storages = _Storages()
    _count_optimizers(storages, optimizers, models, {id(m) for m in stale})
    held = _held(frames, paths)
    for t, node in _saved_tensors(t.grad_fn for t, _, _ in held):
        storages.add(t, "activations", "", f"saved for backward by {node}")
    for t, name, made_by in held:
        storages.add(t, "other", name, made_by)
    categories = storages.by_category()
    cuda = _cuda_device(storages, error)
    message = str(error).strip()
    out: dict[str, Any] = {
        "error": f"{type(error).__name__}: {message.splitlines()[0] if message else ''}".rstrip(": "),
        "requested_bytes": requested_bytes(error),
        "step": int(step),
        "phase": _phase(frames),
        **_location(error.__traceback__, paths),
        "device": str(cuda) if cuda is not None else "cpu",
        "categories": categories,
        "top_tensors": storages.top(TOP_TENSORS),
        "square_bytes": storages.square_bytes,
    }
    out["blocks"], out["blocks_reached"] = _blocks(models, out["module"])
    out["capacity_bytes"], out["capacity_source"] = _capacity(cuda)
    if cuda is not None:
        state = _cuda_state(cuda, sum(categories.values()))
        categories["other"] += state.pop("unattributed_bytes")
        out.update(state)
    out["outside_tensors_bytes"] = _outside_tensors(cuda, out)
    return out


def _outside_tensors(cuda: torch.device | None, out: dict[str, Any]) -> int | None:
    """Memory counted against the capacity that tensors do not hold: on CUDA what the
    caching allocator has not reserved (the CUDA context, other processes); on CPU the
    process's own use beyond its tensors (the interpreter, libraries; address space
    against RLIMIT_AS, resident memory otherwise)."""
    live = sum(out["categories"].values())
    try:
        if cuda is not None:
            free, total = torch.cuda.mem_get_info(cuda)
            return max(0, int(total - free) - int(out["reserved_bytes"]))
        import psutil

        mem = psutil.Process().memory_info()
        used = mem.vms if "RLIMIT_AS" in (out["capacity_source"] or "") else mem.rss
        return max(0, int(used) - live)
    except Exception:
        return None
