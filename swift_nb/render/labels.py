"""What a reader sees for a key of a run's numbers: its label in words, and its value in
its unit (``step_s`` 0.3037 → "Step time", "303.7 ms").

Keys stay keys in run.json, in the summary and in the advisor's ``Finding`` and
``Verdict`` objects; a table a person reads shows the label. Each key's label is written
once, below, beside the key. A key without one reads as its words (``growth_bytes_per_step``
→ "Growth per step", in bytes), never as the identifier itself: its unit is the unit word
among its ``_``-separated words (``_s``, ``_ms``, ``_us``, ``_bytes``, ``_pct``, ``_j``,
``_w``, ``_usd``; ``_per_s`` is a rate).

Torch-free: the render layer and the notebook read it, and so may any later tool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from swift_nb.record.write import EVERY_STEP, MIN_OFF_STEPS, PROFILER_OFF

#: how a value is written: seconds, milliseconds, microseconds, bytes, a percentage (0–100),
#: joules, watts, US dollars, dollars per hour or per kWh, a count, a ratio (×), a tensor
#: shape, or as it is ("")
UNITS = (
    "s",
    "ms",
    "us",
    "bytes",
    "pct",
    "j",
    "w",
    "usd",
    "usd_per_hour",
    "usd_per_kwh",
    "count",
    "ratio",
    "shape",
    "",
)


@dataclass(frozen=True)
class Label:
    """A key's label in words; ``unit``: how its value is written (one of ``UNITS``; None:
    the unit word among the key's own words)."""

    text: str
    unit: str | None = None

    def __post_init__(self) -> None:
        if self.unit is not None and self.unit not in UNITS:
            raise ValueError(
                f"label {self.text!r}: unit must be one of {', '.join(map(repr, UNITS))}; got {self.unit!r}"
            )


# fmt: off
LABELS: dict[str, Label] = {
    # the step and its parts (the verdict, the breakdown, the advisor's loader evidence)
    "step": Label("Step", "count"),
    # One step time (record.step_durations: the median over the steady steps run with the
    # profiler off) and one throughput (its inverse); a figure that measures something else
    # says what in its label.
    "step_s": Label("Step time, traced (profiler on)"),
    "step_time_s": Label("Step time, traced (profiler on)"),
    "steps": Label("Steps", "count"),
    "step_time_median_s": Label("Step time (median, profiler off)"),
    "step_time_p90_s": Label("Step time (90th percentile, profiler off)"),
    "step_time_median_all_s": Label("Step time over every step, compiling and traced ones included (median)"),
    "step_time_traced_median_s": Label("Step time, traced (profiler on, median)"),
    "steps_per_s": Label("Steps per second (1 / the median step, profiler off)", "count"),
    "wall_steps_per_s": Label("Steps per second over the wall time of every step", "count"),
    "wall_s": Label("Wall time"),
    "data_pct": Label("Data loading"),
    "data_s": Label("Data loading"),
    "forward_pct": Label("Forward"),
    "forward_s": Label("Forward"),
    "backward_pct": Label("Backward"),
    "backward_s": Label("Backward"),
    "optimizer_pct": Label("Optimizer"),
    "optimizer_s": Label("Optimizer"),
    "comm_pct": Label("Communication"),
    "comm_s": Label("Communication"),
    "h2d_pct": Label("Host-to-device copies"),
    "h2d_s": Label("Host-to-device copies"),
    "other_pct": Label("Other operators"),
    "other_s": Label("Other operators"),
    "untraced_pct": Label("Python between operators"),
    "untraced_s": Label("Python between operators"),
    "data_s_per_step": Label("Data loading per step"),
    "data_in_ops_s_per_step": Label("… of it in torch operators"),
    "data_in_python_s_per_step": Label("… of it in Python"),
    "samples_per_batch": Label("Samples per batch", "count"),
    "data_s_per_sample": Label("Data loading per sample"),
    "loaded_by": Label("Batches loaded by"),
    "ops_per_step": Label("Operators per step", "count"),
    "median_op_us": Label("Median operator self time"),
    "heavy_op_pct": Label("Step time in substantial operators"),
    "outside_ops_pct": Label("Step time outside operators"),
    "overhead_pct": Label("Step time that is overhead"),
    "batch": Label("Samples per batch", "count"),
    # memory
    "peak_mem_bytes": Label("Peak tensor memory"),
    "peak_bytes": Label("Peak tensor memory"),
    "peak_rss_bytes": Label("Peak resident memory (RSS)"),
    "limit_bytes": Label("Device memory"),
    "predicted_peak_bytes": Label("Predicted peak tensor memory"),
    "predicted_peak_bytes_4bit": Label("Predicted peak, base in 4 bits"),
    "activations_bytes": Label("Activations at the peak"),
    "activations_pct": Label("Activations' share of the peak"),
    "logits_bytes": Label("The loss's logits at the peak"),
    "logits_pct": Label("Logits' share of the peak"),
    "copies": Label("Copies of the logits (fp32 B × T × V)", "count"),
    "vocab_size": Label("Vocabulary", "count"),
    # tokens
    "tokens_per_step": Label("Tokens computed per step", "count"),
    "real_tokens_per_step": Label("Real tokens per step", "count"),
    "tokens_at_peak": Label("Tokens computed in the step at the peak", "count"),
    "padding_pct": Label("Padding among the tokens computed"),
    "counted_from": Label("Real tokens counted from"),
    "real_tokens_per_s": Label("Real tokens per second", "count"),
    "predicted_real_tokens_per_s": Label("Predicted real tokens per second", "count"),
    "predicted_step_s": Label("Predicted step time"),
    "forward_backward_pct": Label("Step time in forward and backward"),
    "restarts_per_run": Label("Samples packed after another in a row", "count"),
    "attn_implementation": Label("Attention kernel"),
    "optimizer_state_bytes": Label("Optimizer state at the peak"),
    "growth_bytes_per_step": Label("Growth per step"),
    "measured_by": Label("Measured by"),
    "category": Label("Category"),
    # one peak (record.write.peak_step: the median recorded step's, at its peak moment);
    # each category's own maximum is another figure and says so
    "at_peak_bytes": Label("At the peak"),
    "max_bytes": Label("Each category's own maximum (at any moment)"),
    "share_pct": Label("Share of the peak"),
    "blocks": Label("Repeated blocks", "count"),
    "blocks_from": Label("Blocks counted from"),
    # attention
    "attention_seq": Label("Attention sequence length", "count"),
    "seq_len": Label("Sequence length", "count"),
    "score_shape": Label("Score matrix shape", "shape"),
    "attention_calls_per_step": Label("Attention calls per step", "count"),
    "score_matrix_bytes": Label("One score matrix"),
    "score_bytes_at_peak": Label("Score matrices alive at the peak"),
    "score_tensors_kept_at_peak": Label("Score matrices kept for backward at the peak", "count"),
    "score_temporaries_at_peak": Label("Score-sized temporaries at the peak", "count"),
    "peak_saved_bytes": Label("Peak saved without them"),
    # precision
    "weights_dtype": Label("Weights' dtype"),
    "mixed_precision": Label("Mixed precision"),
    "base_dtype": Label("Base model's dtype"),
    "dtype": Label("Parameter dtype"),
    "tensors_on": Label("Tensors on"),
    "simt_sgemm_s": Label("fp32 matrix multiplies on CUDA cores"),
    "simt_sgemm_pct_of_gemm": Label("Share of all matrix multiplies"),
    "gemm_s": Label("Matrix multiplies"),
    # fine-tuning
    "method": Label("Fine-tuning method"),
    "rank": Label("Rank", "count"),
    "target_modules": Label("Adapted modules"),
    "adapted_layers": Label("Adapted layers", "count"),
    "trainable_params": Label("Trainable parameters", "count"),
    "lora_adapter_params": Label("LoRA adapter parameters", "count"),
    "lora_optimizer_state_bytes": Label("Optimizer state with LoRA"),
    "lora_saved_bytes": Label("Saved with LoRA"),
    "optim_8bit_state_bytes": Label("Optimizer state with 8-bit AdamW"),
    "lora_saved_pct": Label("Saved with LoRA, share of the peak"),
    "lora_shapes": Label("LoRA layers' shapes from"),
    "lora_dropout": Label("LoRA dropout", "count"),
    "checkpointing": Label("Gradient checkpointing"),
    "use_reentrant": Label("Reentrant checkpointing"),
    "frozen_parameters_bytes": Label("Frozen parameters"),
    "frozen_pct": Label("Frozen parameters' share of the peak"),
    "base_frozen_bytes": Label("Frozen base in fp32"),
    "frozen_models": Label("Frozen models"),
    "model": Label("Model"),
    "requires_grad_params": Label("Parameters requiring grad", "count"),
    "optimized_params": Label("Parameters the optimizers hold", "count"),
    "untrained_params": Label("Parameters nothing trains", "count"),
    "untrained_gradient_bytes": Label("Their gradients"),
    "stale_models": Label("Models alive that nothing uses"),
    "stale_bytes": Label("Held by models nothing uses"),
    "on_device_bytes": Label("Of which on the run's device"),
    "oom_need_bytes": Label("Failed step's need"),
    "oom_room_bytes": Label("Room for tensors"),
    "confidence": Label("Confidence"),
    # communication and ranks
    "world_size": Label("Ranks", "count"),
    "exposed_comm_pct": Label("Exposed communication"),
    "exposed_comm_s_per_step": Label("Exposed communication per step"),
    "exposed_comm_s": Label("Exposed communication"),
    "collective_pct": Label("Time in collectives"),
    "collective_s": Label("Time in collectives"),
    "gradient_bytes": Label("Gradients synchronised per step"),
    "gradient_bytes_from": Label("Gradient bytes from"),
    "allreduce_wire_bytes_per_step": Label("All-reduce bytes sent per rank and step"),
    "measured_wire_bytes_per_step": Label("Bytes sent per step, measured"),
    "kind": Label("Kind"),
    "calls_per_step": Label("Calls per step", "count"),
    "bytes_per_step": Label("Payload per step"),
    "wire_bytes_per_step": Label("Sent per step"),
    "time_s_per_step": Label("Time per step"),
    "bus_bandwidth": Label("Bus bandwidth"),
    "step_pct": Label("Share of the step"),
    "optimizer_share": Label("Share in the optimizer", "ratio"),
    "overlap_share": Label("Overlapped with compute", "ratio"),
    "time_source": Label("Time from"),
    "work_s": Label("Work per step"),
    "work_over_median_pct": Label("Work over the median"),
    "step_over_median_pct": Label("Step over the median"),
    "straggler": Label("Straggler"),
    # the GPU's window
    "window_s": Label("GPU window"),
    "device_idle_pct": Label("GPU idle"),
    "device_compute_pct": Label("GPU computing"),
    "device_non_compute_pct": Label("GPU busy without compute"),
    "comm_compute_overlap_pct": Label("Communication overlapped by compute"),
    "idle_pct": Label("Idle"),
    "compute_pct": Label("Computing"),
    "non_compute_pct": Label("Busy without compute"),
    "idle_s": Label("Idle"),
    "communication_s": Label("Waiting on communication"),
    "overhead_s": Label("Waiting on the host"),
    "copy_s": Label("Copying"),
    "comm_wait_s": Label("Idle: waiting on communication"),
    "sync_s": Label("Idle: synchronisation stalls"),
    "host_bound_s": Label("Idle: launch gaps"),
    "launch_gap_s": Label("Launch gaps"),
    "launch_gap_pct": Label("Launch gaps' share of the window"),
    "kernels_per_step": Label("Kernels per step", "count"),
    "kernel_median_us": Label("Median kernel"),
    "device_time_s": Label("Device time"),
    "count": Label("Count", "count"),
    "time_s": Label("Time"),
    "time_pct": Label("Share of device time"),
    "pageable_copies": Label("Copies from pageable memory", "count"),
    "pageable_copy_s": Label("Time in those copies"),
    "idle_in_copy_calls_s": Label("GPU idle in copy calls"),
    "sync_stall_s": Label("Synchronisation stalls"),
    "sync_stall_pct": Label("Stalls' share of the window"),
    "sync_calls": Label("Synchronising calls", "count"),
    "sync_calls_per_step": Label("Synchronising calls per step", "count"),
    "callers": Label("Made by"),
    "call_sites": Label("In your code at"),
    # torch.compile
    "compile_s": Label("Compiling"),
    "compile_pct": Label("Compiling's share of the steps"),
    "compile_pct_of_steps": Label("Compiling's share of the steps"),
    "compiling_steps": Label("Steps that compiled", "count"),
    "compile_in_steady_steps": Label("Compiling in the steady steps"),
    "steady_step_s": Label("Steady step time"),
    "steady_verdict": Label("The steady steps are"),
    "eager_step_s": Label("Eager step time"),
    "pays_back_after_steps": Label("Pays back after", "count"),
    "recompiles": Label("Recompiles", "count"),
    "recompile_s": Label("Recompiling"),
    "recompile_pct_of_steps": Label("Recompiling's share of the steps"),
    "guards": Label("Guards that failed"),
    "graph_breaks": Label("Graph breaks", "count"),
    "where": Label("Where"),
    "reasons": Label("Why"),
    # operators
    "name": Label("Name"),
    "calls": Label("Calls", "count"),
    "self_time_s": Label("Self time"),
    "total_time_s": Label("Total time"),
    "self_pct": Label("Share of self time"),
    "alloc_bytes": Label("Allocated"),
    "input_shapes": Label("Input shapes"),
    "compiled": Label("Compiled"),
    # utilisation, throughput
    "mean_util_pct": Label("Utilisation (mean)"),
    "peak_util_pct": Label("Utilisation (peak)"),
    "mean_step_util_pct": Label("Utilisation over the steps"),
    "mean_sm_active_pct": Label("SMs active (mean)"),
    "mean_sm_occupancy_pct": Label("Warps occupied (mean)"),
    "mean_tensor_active_pct": Label("Tensor cores active (mean)"),
    "mean_dram_bw_pct": Label("DRAM bandwidth used (mean)"),
    "throttled_steps_pct": Label("Steps throttled"),
    # the GPU's counters in findings' evidence (swift_nb.analysis.counters)
    "utilisation_pct": Label("Utilisation (NVML, over the steps)"),
    "sm_active_pct": Label("SMs active (GPM)"),
    "sm_occupancy_pct": Label("Warps occupied (GPM)"),
    "tensor_active_pct": Label("Tensor cores active (GPM)"),
    "dram_bw_pct": Label("DRAM bandwidth used (GPM)"),
    "gemm_kernel_pct": Label("GEMMs' share of kernel time"),
    "clock_lost_mhz": Label("SM clock lost (MHz)", "count"),
    "clock_max_mhz": Label("SM clock at most (MHz)", "count"),
    "pcie_peak_pct": Label("PCIe, the busiest step, of the link"),
    "pcie_link_bytes_per_s": Label("PCIe link per second, each way"),
    "samples_per_s": Label("Samples per second", "count"),
    "tokens_per_s": Label("Tokens per second", "count"),
    # energy and cost
    "energy_j": Label("Energy"),
    "energy_per_step_j": Label("Energy per step"),
    "avg_power_w": Label("Average power"),
    "cost_usd": Label("Cost"),
    "cost_per_1k_steps_usd": Label("Cost per 1 000 steps"),
    "idle_cost_per_1k_steps_usd": Label("Idle cost per 1 000 steps"),
    "saved_per_1k_steps_usd": Label("Saved per 1 000 steps"),
    "energy_cost_usd": Label("Energy cost"),
    "price_per_hour": Label("Price per device hour", "usd_per_hour"),
    "price_per_kwh": Label("Energy price", "usd_per_kwh"),
    "price_source": Label("Price from"),
    "priced_devices": Label("Devices priced", "count"),
    # a comparison's rows
    "variant": Label("Variant"),
    "status": Label("Status"),
    "step_time_ratio": Label("Step time × baseline", "ratio"),
    "peak_mem_ratio": Label("Peak memory × baseline", "ratio"),
    "predicted": Label("Predicted"),
    "notes": Label("Notes"),
    "ranks": Label("Ranks", "count"),
    "step_time_max_rank_s": Label("Slowest rank's step"),
    "peak_mem_max_rank_bytes": Label("Largest rank peak"),
    "collective_share_max_rank": Label("Most time in collectives", "ratio"),
    # where the run ran (report.html's environment and context)
    "python": Label("Python"),
    "torch": Label("torch"),
    "cuda": Label("CUDA"),
    "platform": Label("Platform"),
    "host": Label("Host"),
    "cpu_count": Label("CPU cores", "count"),
    "mem_total_bytes": Label("Memory"),
    "device": Label("Device"),
    "devices": Label("Devices"),
    "gpu": Label("GPU"),
    "toggles": Label("Toggles"),
    "finetune": Label("Fine-tuning"),
    "optimizer": Label("Optimizer"),
    "params": Label("Parameters", "count"),
    "batch_size": Label("Batch size", "count"),
    "num_workers": Label("DataLoader workers", "count"),
    "nnodes": Label("Nodes", "count"),
}
# fmt: on

#: labels of a key within one finding, where the key alone says less (``optimizer_pct`` is
#: a share of the step in the verdict, of the peak in the optimizer-state finding)
WITHIN: dict[tuple[str, str], Label] = {
    ("optimizer_state", "optimizer_pct"): Label("Optimizer state's share of the peak"),
    # the verdict's shares are of the traced step (the profiler on), not of the step time
    **{
        ("verdict", f"{part}_pct"): Label(f"{text}, share of the traced step")
        for part, text in (
            ("data", "Data loading"),
            ("forward", "Forward"),
            ("backward", "Backward"),
            ("optimizer", "Optimizer"),
            ("comm", "Communication"),
            ("h2d", "Host-to-device copies"),
            ("other", "Other"),
            ("untraced", "Untraced"),
        )
    },
}

#: a key's words that are its unit, and how they read
_UNIT_WORDS = {
    "s": "s",
    "ms": "ms",
    "us": "us",
    "bytes": "bytes",
    "pct": "pct",
    "j": "j",
    "w": "w",
    "usd": "usd",
}
#: words a fallback label spells out
_WORDS = {
    "util": "utilisation",
    "comm": "communication",
    "mem": "memory",
    "h2d": "host-to-device",
    "d2h": "device-to-host",
    "avg": "average",
    "num": "number of",
    "params": "parameters",
    "seq": "sequence",
    "len": "length",
    "op": "operator",
    "ops": "operators",
    "1k": "1 000",
    "max": "most",
    "min": "least",
    "n": "number of",
}


#: the steps a run's step time is the median of (``record.write.step_durations``), in the
#: words its labels carry
STEP_BASES = {PROFILER_OFF: "profiler off", EVERY_STEP: "every step"}
#: what "every step" means, said under a table that shows it
EVERY_STEP_NOTE = (
    f"every step: fewer than {MIN_OFF_STEPS} steps ran with the profiler off, so the median is "
    "over every step, traced ones included"
)


def step_basis(basis: object) -> str:
    """The words for a run's ``step_time_basis`` (its summary's): "profiler off", "every
    step", or "" where the run does not say (recorded before it did)."""
    return STEP_BASES.get(basis, "") if isinstance(basis, str) else ""


def step_column(head: str, cells: Sequence[str], bases: Sequence[object]) -> tuple[str, list[str]]:
    """A column of runs' step-time figures (``cells``, written; "–" for none, one per
    run's ``step_time_basis`` in ``bases``): its heading, ``head`` ("step (median") closed
    with the basis every run shares ("step (median, profiler off)"), and its cells, each
    with its own basis ("75.0 ms (every step)") where the runs do not share one, so that no
    figure claims another's."""
    words = [step_basis(b) for b in bases]
    if len(set(words)) <= 1:
        shared = words[0] if words else ""
        return (f"{head}, {shared})" if shared else f"{head})"), list(cells)
    return f"{head})", [f"{c} ({w})" if w and c != "–" else c for c, w in zip(cells, words, strict=True)]


def step_note(bases: Sequence[object]) -> str | None:
    """The line under a table of runs' step times where one of them is over every step."""
    return EVERY_STEP_NOTE if any(step_basis(b) == STEP_BASES[EVERY_STEP] for b in bases) else None


def step_label(key: str, basis: object) -> str:
    """``key``'s label for a run whose step time is over ``basis``: a label that names
    the profiler-off basis ("Steps per second (1 / the median step, profiler off)") names
    the run's own instead ("…, every step)"), or none where the run does not say."""
    text = label(key)
    claim = f", {STEP_BASES[PROFILER_OFF]})"
    if not text.endswith(claim):
        return text
    words = step_basis(basis)
    return text.removesuffix(claim) + (f", {words})" if words else ")")


def label(key: str, within: str | None = None) -> str:
    """What a reader sees for ``key`` (``within``: the finding it belongs to, when a label
    is written for it there)."""
    found = WITHIN.get((within, key)) if within else None
    found = found or LABELS.get(key)
    return found.text if found is not None else _words(key)


def unit(key: str) -> str:
    """How ``key``'s value is written (one of ``UNITS``)."""
    found = LABELS.get(key)
    if found is not None and found.unit is not None:
        return found.unit
    words = key.lower().split("_")
    for i, word in enumerate(words):
        if word == "per" and i + 1 < len(words) and words[i + 1] == "s":
            return "count"  # a rate: steps_per_s
        if word in _UNIT_WORDS and not (word == "s" and i > 0 and words[i - 1] == "per"):
            return _UNIT_WORDS[word]
    return ""


def _words(key: str) -> str:
    """A key without a label, in words: its unit words dropped, abbreviations spelled out."""
    words = key.split("_")
    kept = [w for i, w in enumerate(words) if not (w.lower() in _UNIT_WORDS and not _rate(words, i))]
    if kept and kept[-1] == "per":  # "growth_bytes_per_step" keeps "per step"; a bare "per" is not
        kept.pop()
    spelled = ["second" if w == "s" else _WORDS.get(w.lower(), w) for w in kept if w]
    text = " ".join(spelled) or key.replace("_", " ")
    return text[:1].upper() + text[1:]


def _rate(words: list[str], i: int) -> bool:
    return words[i] == "s" and i > 0 and words[i - 1] == "per"
