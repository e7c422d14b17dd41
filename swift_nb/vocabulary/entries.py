"""Every toggle's entry (``TOGGLES``), in the order menus and help list them, and the
look-ups everything that names a toggle uses."""

from __future__ import annotations

from collections.abc import Callable, Collection

from swift_nb.core.errors import ConfigError
from swift_nb.vocabulary.schema import (
    Entry,
    Param,
    StepCost,
    at_least,
    between,
    between_float,
    positive,
    valid_regex,
)

_GALORE_PROJ_TYPES = ("std", "reverse_std", "right", "left", "full")
_LORA_PARAMS = (
    Param("r", int, 8, "rank of the adapters", at_least(1), aliases=("rank",)),
    Param("alpha", float, 16.0, "scaling numerator (the update is scaled by alpha / r)", positive),
    Param(
        "targets",
        str,
        "auto",
        "modules to adapt: auto (the attention and MLP linear layers) or names, '|'-separated",
        aliases=("target_modules",),
    ),
    Param("dropout", float, 0.0, "dropout on the adapters' input", between_float(0.0, 1.0)),
)

_COMPILE_PARAMS = (
    Param(
        "mode",
        str,
        "default",
        "torch.compile's mode",
        choices=("default", "reduce-overhead", "max-autotune"),
    ),
    Param(
        "dynamic",
        bool,
        None,
        "true: compile for dynamic shapes from the start; false: one graph per shape; "
        "unset: torch decides after the first size change",
    ),
    Param(
        "backend",
        str,
        "inductor",
        "inductor (generated kernels; needs a C++ compiler on CPU), aot_eager or eager "
        "(graphs only, no code generation)",
        choices=("inductor", "aot_eager", "eager"),
    ),
)

# the dtype a data-parallel layout reduces its gradients in (what swift_nb.scale prices)
_GRAD_DTYPE = Param(
    "grad_dtype",
    str,
    "fp32",
    "dtype the gradients are reduced in (bf16: half the bytes on the wire)",
    aliases=("reduce",),
    choices=("fp32", "bf16"),
)

#: Every toggle, in the order menus and help list them. A new toggle is one entry here
#: (its words, what it acts on, its step cost, what runs on a fake model in its place) and,
#: when it can be applied, its file under ``swift_nb/toggles/``.
TOGGLES: dict[str, Entry] = {
    e.id: e
    for e in (
        Entry(
            "flash_attention",
            "FlashAttention",
            flag="flash-attn",
            help="route attention to fused (flash) kernels for this run",
            implementation="swift_nb.toggles.flash_attention:FlashAttention",
            forecast_error_pct=5.0,  # benchmark: −4.1 % and −6.6 % (the fused kernel's own buffers)
            acts_on="attention_scores",
            step=StepCost(
                0.9,
                "fused attention instead of [.., T, T] scores (≈ −10 %)",
                without=(1.0, "attention is fused already"),
            ),
        ),
        Entry(
            "grad_checkpointing",
            "gradient checkpointing",
            (Param("every_n", int, 1, "checkpoint every n-th block", at_least(1), aliases=("n",)),),
            flag="grad-ckpt",
            help="activation checkpointing on the repeated blocks for this run",
            metavar="every_n=N",
            implementation="swift_nb.toggles.grad_checkpointing:GradCheckpointing",
            forecast_error_pct=5.0,  # benchmark: +5.9 % and +5.8 % (blocks taken as equal)
            acts_on="repeated_blocks",
            step=StepCost(1.33, "one more forward of the checkpointed blocks in backward (≈ +33 %)"),
            on_fake_model="grad_checkpointing",
        ),
        Entry(
            "activation_offload",
            "activation offloading",
            flag="activation-offload",
            help="the tensors saved for backward kept in pinned host memory (torch's save_on_cpu) for this run; "
            "CUDA only",
            implementation="swift_nb.toggles.activation_offload:ActivationOffload",
            forecast_error_pct=15.0,  # what stays on the device while a block computes
            cuda=(0, 0),
            acts_on="repeated_blocks",
            step=StepCost(1.15, "saved tensors copied to the host and back, partly overlapped (≈ +15 %)"),
        ),
        Entry(
            "lora",
            "LoRA",
            _LORA_PARAMS,
            flag="lora",
            help="LoRA adapters (peft) on the cell's model for this run; the optimizers train only them",
            metavar="r=8,alpha=16,targets=auto,dropout=0",
            implementation="swift_nb.toggles.lora:LoRA",
            forecast_error_pct=5.0,  # the adapters' own activations (x @ A) are estimated
            label_params=("r",),
            excludes=("qlora", "galore"),
            acts_on="full_training",
            step=StepCost(0.8, "no gradients for the frozen weights: backward ≈ ⅔ of its work (≈ −20 %)"),
            on_fake_model="lora",
            changes_training=True,
        ),
        Entry(
            "qlora",
            "QLoRA",
            _LORA_PARAMS,
            flag="qlora",
            help="4-bit NF4 base (bitsandbytes, CUDA only) plus LoRA adapters for this run",
            metavar="r=8,alpha=16,targets=auto,dropout=0",
            implementation="swift_nb.toggles.lora:QLoRA",
            forecast_error_pct=10.0,  # dequantized weight copies in forward and backward
            label_params=("r",),
            excludes=("lora", "galore", "fp8"),
            cuda=(0, 0),
            acts_on="full_training",
            step=StepCost(1.0, "LoRA's saving spent dequantizing the 4-bit weights in forward and backward"),
            # a 4-bit base cannot be quantized on fake tensors: LoRA runs, the base is priced at NF4's size
            on_fake_model="lora",
            changes_training=True,
        ),
        Entry(
            "galore",
            "GaLore",
            (
                Param("rank", int, 128, "rank of the gradient projection", at_least(1), aliases=("r",)),
                Param(
                    "update_proj_gap",
                    int,
                    200,
                    "steps between projection updates",
                    at_least(1),
                    aliases=("gap",),
                ),
                Param("scale", float, 0.25, "scale of the projected update", positive),
                Param(
                    "proj_type", str, "std", "projection side", aliases=("proj",), choices=_GALORE_PROJ_TYPES
                ),
                Param(
                    "target", str, None, "regex on module paths of the Linear layers to project", valid_regex
                ),
            ),
            flag="galore",
            help="GaLore AdamW in place of Adam/AdamW for this run (needs galore-torch)",
            metavar="rank=R,gap=G,scale=S,proj_type=std,target=REGEX",
            implementation="swift_nb.toggles.galore:GaLore",
            label_params=("rank",),
            excludes=("optim_8bit", "lora", "qlora"),
            acts_on="adam",
            step=StepCost(1.05, "an SVD of each projected gradient every update_proj_gap steps (≈ +5 %)"),
            changes_training=True,
        ),
        Entry(
            "optim_8bit",
            "8-bit AdamW",
            flag="optim-8bit",
            help="the cell's Adam/AdamW replaced by bitsandbytes' AdamW8bit (same hyper-parameters and groups) for "
            "this run",
            implementation="swift_nb.toggles.optim_8bit:Optim8bit",
            forecast_error_pct=2.0,  # its state's layout is exact; the quantization's scratch is not
            excludes=("galore",),
            acts_on="adam_state",
            step=StepCost(1.0, "8-bit moments: the update's (de)quantization is small beside the step"),
        ),
        Entry(
            "sequence_parallel",
            "Sequence parallelism",
            (
                Param(
                    "sp_size",
                    int,
                    2,
                    "ranks the sequence is split over (= worker processes)",
                    at_least(2),
                    aliases=("sp",),
                ),
                Param(
                    "sp_mode",
                    str,
                    "ulysses",
                    "ulysses (all-to-all of heads; heads divisible by sp_size) or ring (K/V passed around)",
                    aliases=("mode",),
                    choices=("ulysses", "ring"),
                ),
                Param(
                    "ring_chunk_size",
                    int,
                    None,
                    "tokens per ring-attention tile (default: the whole shard)",
                    at_least(1),
                    aliases=("chunk_size",),
                ),
            ),
            flag="sequence-parallel",
            help="split the sequence over sp_size ranks (only inside a multi-process rerun: use it in --compare)",
            metavar="sp_size=2,sp_mode=ulysses|ring,ring_chunk_size=N",
            implementation="swift_nb.toggles.sequence_parallel:SequenceParallel",
            processes="sp_size",
            label_params=("sp_size",),
            forecast_error_pct=10.0,  # communication buffers and the attention's own layout
        ),
        Entry(
            "bf16_autocast",
            "bf16 autocast",
            flag="bf16",
            help="autocast the cell to bfloat16 (CPU and CUDA) for this run",
            implementation="swift_nb.toggles.bf16_autocast:BF16Autocast",
            forecast_error_pct=15.0,  # which ops autocast keeps in fp32 differs by model and device
            acts_on="fp32_compute",
            step=StepCost(0.6, "bf16 tensor cores (≈ −40 %)", cpu=(1.0, "no bf16 tensor cores on the CPU")),
        ),
        Entry(
            "fp8",
            "FP8 training",
            flag="fp8",
            help="torchao's float8 training of the model's linear layers for this run; CUDA with compute "
            "capability 8.9 or more (Ada, Hopper, Blackwell)",
            implementation="swift_nb.toggles.fp8:FP8",
            forecast_error_pct=15.0,  # float8 copies kept for backward are not modelled
            excludes=("qlora",),
            cuda=(8, 9),
            step=StepCost(0.8, "float8 matmuls of the linear layers (≈ −20 %)"),
        ),
        Entry(
            "fused_ce",
            "fused cross-entropy",
            flag="fused-ce",
            help="the causal LM's loss from its hidden states without its full logits (Liger-Kernel on CUDA, "
            "cut-cross-entropy elsewhere) for this run",
            implementation="swift_nb.toggles.fused_ce:FusedCE",
            forecast_error_pct=15.0,  # what the fused kernel keeps of one chunk differs by implementation
            excludes=("liger",),
            acts_on="lm_logits",
            step=StepCost(1.0, "the loss chunked over the tokens: the same matmul"),
        ),
        Entry(
            "liger",
            "Liger-Kernel",
            flag="liger",
            help="Liger-Kernel's Triton kernels for the model's family (RMSNorm, RoPE, SwiGLU, fused linear "
            "cross-entropy) for this run; CUDA only",
            implementation="swift_nb.toggles.liger:Liger",
            forecast_error_pct=15.0,  # its RMSNorm and SwiGLU kernels' saved tensors are not modelled
            excludes=("fused_ce",),
            cuda=(0, 0),
            acts_on="lm_logits",
            step=StepCost(0.9, "fused RMSNorm, RoPE, SwiGLU and loss kernels (≈ −10 %)"),
        ),
        Entry(
            "packing",
            "packing",
            flag="packing",
            help="each batch's real tokens packed into one row, samples kept apart (FlashAttention's varlen "
            "kernel on CUDA, a block-diagonal mask elsewhere) for this run",
            implementation="swift_nb.toggles.packing:Packing",
            forecast_error_pct=10.0,  # the block-diagonal mask's N² entries, and activations per real token
            acts_on="lm_padding",
            step=StepCost(reason="only the real tokens computed", per_real_share=True),
        ),
        Entry(
            "zero",
            "ZeRO",
            (
                Param(
                    "stage",
                    int,
                    1,
                    "1: optimizer state, 2: + gradients, 3: + parameters sharded",
                    between(1, 3),
                ),
            ),
            forecast_error_pct=5.0,  # gathered and bucketed copies
            label_params=("stage",),
        ),
        Entry(
            "torch_compile",
            "torch.compile",
            _COMPILE_PARAMS,
            flag="compile",
            help="torch.compile the models the cell uses for this run (restored after)",
            metavar="mode=default|reduce-overhead|max-autotune,dynamic=true|false",
            implementation="swift_nb.toggles.torch_compile:TorchCompile",
            forecast_error_pct=10.0,  # fused kernels keep fewer intermediates; not modelled
            excludes=("regional_compile",),
            step=StepCost(0.9, "a compiled model (≈ −10 % steady; compiling first)"),
        ),
        Entry(
            "regional_compile",
            "regional compile",
            _COMPILE_PARAMS,
            flag="regional-compile",
            help="torch.compile each repeated block of the models the cell uses (one compiled code for all of "
            "them) for this run",
            metavar="mode=default|reduce-overhead|max-autotune,dynamic=true|false",
            implementation="swift_nb.toggles.regional_compile:RegionalCompile",
            forecast_error_pct=10.0,  # fused kernels keep fewer intermediates; not modelled
            excludes=("torch_compile",),
            step=StepCost(0.9, "compiled blocks (≈ −10 % steady; compiling first)"),
        ),
        Entry(
            "fsdp",
            "FSDP",
            (
                Param(
                    "world_size",
                    int,
                    2,
                    "ranks the model is sharded over (= worker processes)",
                    at_least(2),
                    aliases=("ws",),
                ),
                _GRAD_DTYPE,
            ),
            help="FSDP2 fully_shard on the repeated blocks and the root, over world_size ranks (in --compare); "
            "grad_dtype=bf16 reduce-scatters the gradients in bf16 (MixedPrecisionPolicy(reduce_dtype=...))",
            metavar="world_size=2,grad_dtype=fp32|bf16",
            implementation="swift_nb.toggles.fsdp:FSDP",
            processes="world_size",
            forecast_error_pct=10.0,  # gathered blocks, padding of the shards
        ),
        Entry(
            "ddp",
            "DDP",
            (
                Param(
                    "world_size",
                    int,
                    2,
                    "ranks the model is replicated on (= worker processes)",
                    at_least(2),
                    aliases=("ws",),
                ),
                _GRAD_DTYPE,
            ),
            help="DistributedDataParallel on world_size ranks (in --compare); grad_dtype=bf16 all-reduces the "
            "gradients in bf16 (DDP's bf16_compress_hook)",
            metavar="world_size=2,grad_dtype=fp32|bf16",
            implementation="swift_nb.toggles.ddp:DDP",
            processes="world_size",
            forecast_error_pct=5.0,  # the gradient buckets
        ),
    )
}


def register(entry: Entry) -> Entry:
    """Add ``entry`` to the vocabulary (a new toggle, or one a test defines)."""
    if entry.id in TOGGLES:
        raise ValueError(f"a toggle named {entry.id!r} exists already")
    TOGGLES[entry.id] = entry
    return entry


def unregister(toggle_id: str) -> None:
    TOGGLES.pop(toggle_id, None)


def entry(toggle_id: str, runnable: bool = False) -> Entry:
    """The entry of ``toggle_id``; ConfigError for an unknown one (or, with ``runnable``,
    one that only the forecast understands)."""
    known = runnable_ids() if runnable else list(TOGGLES)
    found = TOGGLES.get(str(toggle_id).strip())
    if found is None or found.id not in known:
        raise ConfigError("toggle", f"must be one of {', '.join(known)}", toggle_id)
    return found


def clashes(toggle_ids: Collection[str]) -> str | None:
    """Why ``toggle_ids`` cannot run together (the first pair an entry excludes, either way
    round), or None when they can."""
    ids = [t for t in toggle_ids if t in TOGGLES]
    for i, a in enumerate(ids):
        for b in ids[i + 1 :]:
            if b in TOGGLES[a].excludes or a in TOGGLES[b].excludes:
                return f"{a} and {b} cannot run together: {_WHY.get(frozenset((a, b)), 'they change the same thing')}"
    return None


#: why the pairs the entries exclude clash
_WHY: dict[frozenset[str], str] = {
    frozenset(("galore", "optim_8bit")): "each replaces the cell's Adam/AdamW",
    frozenset(("galore", "lora")): "GaLore projects full weights' gradients; LoRA trains adapters only",
    frozenset(("galore", "qlora")): "GaLore projects full weights' gradients; QLoRA trains adapters only",
    frozenset(("lora", "qlora")): "QLoRA is LoRA on a 4-bit base: choose one",
    frozenset(("fp8", "qlora")): "the 4-bit base's layers are not float8 linear layers",
    frozenset(("fused_ce", "liger")): "Liger's kernels include the fused cross-entropy",
    frozenset(("regional_compile", "torch_compile")): "each compiles the model: choose one",
}


def needs_cuda(toggle_id: str) -> tuple[int, int] | None:
    """The least CUDA compute capability ``toggle_id`` needs ((0, 0): any CUDA device), or
    None when it runs on the CPU too."""
    e = TOGGLES.get(toggle_id)
    return None if e is None else e.cuda


def runnable_ids() -> list[str]:
    """The toggles that can be applied to a run (not only forecast)."""
    return [e.id for e in TOGGLES.values() if e.runnable]


def flagged() -> list[Entry]:
    """The entries with a magic flag, in order."""
    return [e for e in TOGGLES.values() if e.flag is not None]


def flag_of(toggle_id: str) -> str | None:
    """``galore`` → ``--galore``; None when the toggle has no flag."""
    e = TOGGLES.get(toggle_id)
    return None if e is None or e.flag is None else "--" + e.flag


def param_flag(param: str, otherwise: Callable[[str], str]) -> str:
    """A toggle parameter as the magic spells it in an error (``galore rank`` →
    ``--galore rank``); other names through ``otherwise``."""
    tid, _, rest = param.partition(" ")
    flag = flag_of(tid)
    return f"{flag} {rest}".strip() if flag is not None else otherwise(param)
