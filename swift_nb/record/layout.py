"""The names of a run folder's files and the columns of its tables: the on-disk contract."""

from __future__ import annotations

from pathlib import Path

SCHEMA_VERSION = 1
DEFAULT_KEEP = 20
ENV_DIR = "SWIFT_NB_DIR"
ENV_KEEP = "SWIFT_NB_KEEP"
RUN_FILE = "run.json"
STEPS_FILE = "steps.csv"
SAMPLES_FILE = "samples.csv"
MEMORY_FILE = "memory.csv"
MODULES_FILE = "modules.csv"
TRACE_FILE = "trace.json.gz"
RANKS_FILE = "ranks.csv"
RANK_STEPS_FILE = "rank_steps.csv"
RANK_SAMPLES_FILE = "rank_samples.csv"
PIN_FILE = "PINNED"
REPORT_FILE = "report.html"
COMPARE_FILE = "compare.html"
ANALYSIS_FILE = "analysis.json"
TABLES_SUFFIX = ".tables.npz"  # a trace's cached tables, beside it (see tables_path)


def rank_trace_file(rank: int) -> str:
    """The trace of ``rank`` in a job folder (``trace.rank<R>.json.gz``, rank 0 too)."""
    return f"trace.rank{rank}.json.gz"


def rank_folder(job: Path, rank: int) -> Path:
    """Where ``rank`` of a job keeps its own record, inside the job folder."""
    return Path(job) / f"rank{rank}"


def tables_path(trace_path: Path) -> Path:
    """Where a trace's tables are cached: ``trace.json.gz`` → ``trace.tables.npz``,
    ``trace.rank3.json.gz`` → ``trace.rank3.tables.npz``."""
    trace_path = Path(trace_path)
    return trace_path.with_name(trace_path.name.removesuffix(".json.gz") + TABLES_SUFFIX)


#: ok: ended normally; failed: the code raised; interrupted: Ctrl-C / the kernel's stop;
#: terminated: SIGTERM or SIGHUP (a scheduler, `timeout`, a shutdown), saved in full;
#: crashed: the process died while running (SIGKILL, OOM killer, power loss) — the record
#: holds what was flushed until then; running: still being written by a live process.
STATUSES = ("running", "ok", "failed", "oom", "interrupted", "terminated", "crashed")

# steps.csv columns. Times in seconds from the run's start (perf_counter clock), bytes.
#   step: 0-based step index; start_s/end_s/duration_s: the step's span;
#   phase: profiler schedule action for the step (none|wait|warmup|active);
#   trigger: what ended the step (optimizer|explicit|end; trace: a step imported from a
#     trace, its profiler's ProfilerStep#N span — swift_nb.importing.assembly);
#   overhead_s: time swift_nb's own step hook took at the boundary that began the step
#     (not part of duration_s; the profiler's trace export shows up here);
#   peak_tensor_bytes: peak bytes held by tensors during the step — CUDA: the caching
#     allocator's max_memory_allocated (every step); CPU: resident optimizer state
#     (params, grads, optimizer state) at the step's start plus the highest rise of the
#     profiler's allocation counter within the step (steps the profiler recorded; empty
#     elsewhere);
#   reserved_bytes: CUDA allocator reserved bytes at the step's end;
#   rss_bytes: process resident set size at the step's end;
#   parameters_bytes … other_bytes (recorded steps, with memory profiling): tensor bytes of
#     each category at the step's peak (see memory.csv);
#   carried_bytes (CUDA, recorded steps): of other_bytes, what the allocator held at the
#     step's start beyond the parameters, frozen weights, gradients and optimizer state (library
#     workspaces such as cuBLAS's, caches, the batch: made before the recording, never seen made);
#   compile_s: seconds the step spent in torch.compile's compiling (dynamo, the backend,
#     a lazy backward compile; swift_nb.capture.compile), 0 when it compiled nothing;
#   tokens, real_tokens (written when the run ends; steps whose model received token ids):
#     positions the model computed (batch × sequence) and those that are not padding
#     (swift_nb.capture.tokens), summed over the step's forward calls;
#   gpu{i}_util_pct, gpu{i}_sm_active_pct … gpu{i}_sm_clock_mhz, gpu{i}_throttled_pct (runs that
#     sampled a GPU): the step's time-weighted mean of each counter, and the share of it the
#     clocks were held down (swift_nb.record.counters).
STEP_COLUMNS = [
    "step",
    "start_s",
    "end_s",
    "duration_s",
    "phase",
    "trigger",
    "overhead_s",
    "peak_tensor_bytes",
    "reserved_bytes",
    "rss_bytes",
    "compile_s",
]

# samples.csv columns. t_s: seconds from the run's start; kind: periodic|step;
# step: the step in progress when sampled; cpu_pct: process CPU % (100 = one core);
# rss_bytes: process RSS; sys_mem_used_bytes / sys_mem_pct: whole machine;
# cuda{i}_allocated_bytes / cuda{i}_reserved_bytes: torch's caching allocator;
# gpu{i}_util_pct, gpu{i}_mem_util_pct (memory controller), gpu{i}_mem_used_bytes,
# gpu{i}_mem_total_bytes, gpu{i}_sm_clock_mhz, gpu{i}_temp_c, gpu{i}_power_w: NVML;
# gpu{i}_energy_j (NVML's energy counter, or the power integrated) and cpu_energy_j (RAPL):
# joules since the run's first sample, cumulative (swift_nb.capture.resources.energy);
# gpu{i}_sm_active_pct, _sm_occupancy_pct, _tensor_active_pct, _dram_bw_pct,
# _pcie_tx/_rx_bytes_per_s, _nvlink_tx/_rx_bytes_per_s (NVML GPM, Hopper and newer: each the
# mean over the window ending at the sample, gpu{i}_gpm_window_s wide; empty where the window
# would be under 100 ms),
# gpu{i}_pcie_max_bytes_per_s, gpu{i}_clock_reasons (NVML's clocks-event bitmask) and
# gpu{i}_sm_clock_max_mhz (swift_nb.capture.resources.gpm).
SAMPLE_COLUMNS = [
    "t_s",
    "kind",
    "step",
    "rank",
    "cpu_pct",
    "rss_bytes",
    "sys_mem_used_bytes",
    "sys_mem_pct",
]


# memory.csv: tensor bytes by category over the recorded steps (see
# swift_nb.capture.memory.categories): t_s (run clock), step, then one column per category.
# parameters: what the optimizers train; frozen_parameters: the parameters and buffers of the
# cell's models that nothing trains (a LoRA base, a frozen encoder, a reference model) at
# their stored bytes (quantized: packed, plus their quantization state). A run written before
# frozen_parameters existed reads it back as unknown (an empty column), not as 0.
MEMORY_CATEGORIES = [
    "parameters",
    "frozen_parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "logits",
    "other",
]
MEMORY_COLUMNS = ["t_s", "step", *(f"{c}_bytes" for c in MEMORY_CATEGORIES)]

# modules.csv: the recorded steps by module (swift_nb.analysis.modules), one row per module of
# the models the run used, written with the report. path: the module's named_modules path (its
# root: the model's variable); parent: its parent's path (empty for a root); class, depth;
# calls: forward calls per step; forward_s/backward_s: per step, its children included;
# forward_self_s/backward_self_s: its own part; total_s = forward_s + backward_s;
# step_share: total_s / the mean recorded step; saved_bytes: what its forward (children
# included) kept for backward per step; saved_self_bytes: its own ops'; parameter/gradient/
# state_bytes: its parameters, their gradients and their optimizer state, children included;
# peak_share: those bytes / the peak's; role: "lm_head" (the model's output embeddings),
# "adapter" (a peft adapter's part), "sharded" (an FSDP2 unit) or empty; dtype: its own
# parameters' element type ("mixed", empty without any). A run recorded without module
# scopes has no file; one recorded before role and dtype reads them empty.
MODULES_COLUMNS = [
    "path",
    "parent",
    "class",
    "depth",
    "calls",
    "forward_s",
    "backward_s",
    "forward_self_s",
    "backward_self_s",
    "total_s",
    "step_share",
    "saved_bytes",
    "saved_self_bytes",
    "parameter_bytes",
    "gradient_bytes",
    "state_bytes",
    "peak_share",
    "role",
    "dtype",
]

#: the summary's key for the models alive in the kernel that the run neither trained nor ran
#: (``swift_nb.capture.memory.stale_models``): a list of ``{"variable", "class", "bytes", "device",
#: "device_bytes"}``, the largest first; bytes: their parameters' and buffers' storages that
#: nothing the run used holds too, counted as ``other`` in memory by category; device: where
#: most of them are; device_bytes: how many on each device (not in runs recorded before it).
#: A run recorded before the key existed has no such key (unknown, not none).
STALE_MODELS_KEY = "stale_models"

#: the context's key for the training framework found around the loop (a Trainer or an
#: Accelerator: ``swift_nb.capture.frameworks.detect``)
TRAINER_KEY = "trainer"
#: a Trainer's checkpointing switch, by the name transformers 5 gives it, then the older one
#: (a deprecated alias since); the context records which the installed one has
CHECKPOINTING_FIELDS = ("activation_checkpointing", "gradient_checkpointing")
