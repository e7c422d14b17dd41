"""The toggles' vocabulary: what each toggle is called, how it is written, its parameters.

One entry per toggle (``TOGGLES``), torch-free, read by everything that names a toggle:
the magic's flags and help, ``--compare`` variants, ``--forecast`` and ``swift_nb.forecast``
specs, the forecast form, the rerun launcher, the findings. Implementations live in
``swift_nb/toggles/<id>.py`` (``Entry.implementation``, imported only when a toggle is
built); an entry without one is understood by the forecast only (``zero``).

The one grammar of a toggle spec:

- a toggle: ``galore``, ``galore(rank=64,gap=200)`` or ``galore:rank=64,gap=200``;
- a list: toggles separated by commas; a ``key=value`` after a ``:`` spec continues it
  (``flash_attention,galore:rank=64,gap=200`` is two toggles);
- a variant (``--compare``): toggles joined by ``+`` (``grad_checkpointing+galore(rank=64)``);
  variants are a list of those.

Parameter values are converted and checked by their ``Param``; names or aliases (``gap``)
both work.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from swift_nb.core.errors import ConfigError

_KIND = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


@dataclass(frozen=True)
class Param:
    """One toggle parameter: ``kind`` converts the text of a spec (``rank=64``), ``check``
    returns an error requirement or None; ``aliases`` are short spellings (``gap``);
    ``choices``: the values it takes, where they are few (menus offer them)."""

    name: str
    kind: type
    default: Any
    help: str
    check: Callable[[Any], str | None] | None = None
    aliases: tuple[str, ...] = ()
    choices: tuple[Any, ...] = ()

    def convert(self, value: Any) -> Any:
        if isinstance(value, str) and self.kind is not str:
            text = value.strip()
            try:
                if self.kind is bool:
                    if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
                        raise ValueError(text)
                    value = text.lower() in ("1", "true", "yes")
                else:
                    value = self.kind(text)
            except ValueError:
                raise ConfigError(self.name, f"must be {_KIND[self.kind]}", value) from None
        elif self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif value is not None and not isinstance(value, self.kind):
            raise ConfigError(self.name, f"must be {_KIND[self.kind]}", value)
        if value is not None and self.choices and value not in self.choices:
            raise ConfigError(self.name, f"must be one of {', '.join(map(str, self.choices))}", value)
        if value is not None and self.check is not None:
            problem = self.check(value)
            if problem:
                raise ConfigError(self.name, problem, value)
        return value


def at_least(n: int) -> Callable[[Any], str | None]:
    return lambda v: None if v >= n else f"must be ≥ {n}"


def between(lo: int, hi: int) -> Callable[[Any], str | None]:
    return lambda v: None if lo <= v <= hi else f"must be between {lo} and {hi}"


def between_float(lo: float, hi: float) -> Callable[[Any], str | None]:
    return lambda v: None if lo <= v <= hi else f"must be between {lo:g} and {hi:g}"


def positive(v: float) -> str | None:
    return None if v > 0 else "must be > 0"


def valid_regex(v: str) -> str | None:
    try:
        re.compile(v)
    except re.error as e:
        return f"must be a regular expression ({e})"
    return None


@dataclass(frozen=True)
class Entry:
    """A toggle's words. ``flag``: the magic's flag without dashes (``flash-attn``; None:
    no flag); ``help`` and ``metavar``: its help; ``implementation``: ``module:Class`` of the
    toggle that applies it (None: the forecast alone knows it); ``forecast_error_pct``: how
    far off (± %) a forecast with this toggle may be beyond the base error; ``processes``:
    the parameter that sets how many worker processes a rerun with it launches (one per
    rank), when it needs several; ``process_choices``: the counts a menu offers;
    ``label_params``: parameters a forecast's label names even at their default."""

    id: str
    title: str
    params: tuple[Param, ...] = ()
    flag: str | None = None
    help: str = ""
    metavar: str = ""
    implementation: str | None = None
    forecast_error_pct: float = 0.0
    processes: str | None = None
    label_params: tuple[str, ...] = ()
    process_choices: tuple[int, ...] = (2, 4, 8)

    @property
    def dest(self) -> str | None:
        """The magic's argparse destination of ``flag`` (``flash_attn``)."""
        return None if self.flag is None else self.flag.replace("-", "_")

    @property
    def runnable(self) -> bool:
        return self.implementation is not None

    def param(self, key: str) -> Param | None:
        """The parameter named ``key`` or one of its aliases."""
        return next((p for p in self.params if key == p.name or key in p.aliases), None)

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    def validate(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Full parameter values from ``values`` (names or aliases; text or typed); a
        ConfigError names the first bad one."""
        out = self.defaults()
        for key, value in values.items():
            p = self.param(key)
            if p is None:
                known = ", ".join(p.name for p in self.params) or "none"
                raise ConfigError(
                    f"{self.id} {key}", f"is not a parameter of {self.id} (known: {known})", value
                )
            try:
                out[p.name] = p.convert(value)
            except ConfigError as e:
                raise ConfigError(f"{self.id} {key}", e.requirement, e.value) from None
        return out

    def changed(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The values that differ from their defaults (None values left out)."""
        defaults = self.defaults()
        return {k: v for k, v in values.items() if v is not None and v != defaults.get(k)}


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

#: Every toggle, in the order menus and help list them. A new toggle is one entry here
#: and, when it can be applied, its file under ``swift_nb/toggles/``.
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
            (
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
            ),
            flag="compile",
            help="torch.compile the models the cell uses for this run (restored after)",
            metavar="mode=default|reduce-overhead|max-autotune,dynamic=true|false",
            implementation="swift_nb.toggles.torch_compile:TorchCompile",
            forecast_error_pct=10.0,  # fused kernels keep fewer intermediates; not modelled
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
            ),
            help="FSDP2 fully_shard on the repeated blocks and the root, over world_size ranks (in --compare)",
            metavar="world_size=2",
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
            ),
            help="DistributedDataParallel on world_size ranks (in --compare)",
            metavar="world_size=2",
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


# -- the grammar ---------------------------------------------------------------------------


def parse_params(spec: str | None) -> dict[str, str]:
    """``"rank=64,gap=200"`` → ``{"rank": "64", "gap": "200"}`` (values converted later)."""
    out: dict[str, str] = {}
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("toggle parameter", "must be written key=value (e.g. rank=64,gap=200)", item)
        out[key.strip()] = value.strip()
    return out


def parse_item(text: str) -> tuple[str, dict[str, str]]:
    """``"galore(rank=64)"`` or ``"galore:rank=64"`` → ``("galore", {"rank": "64"})``; the
    id is not checked here."""
    text = text.strip()
    if "(" in text:
        tid, _, rest = text.partition("(")
        if not rest.endswith(")"):
            raise ConfigError("toggle", "must close its parameters with ')' (e.g. galore(rank=64))", text)
        return tid.strip(), parse_params(rest[:-1])
    tid, _, rest = text.partition(":")
    return tid.strip(), parse_params(rest)


def _top_level(text: str, sep: str, what: str = "toggles") -> list[str]:
    """``text`` split at ``sep`` outside parentheses (``what``: the option, for errors)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                break
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ConfigError(what, "has unbalanced parentheses", text)
    parts.append(text[start:])
    return [p.strip() for p in parts]


def split_list(text: str, what: str = "toggles") -> list[str]:
    """A comma-separated list of toggle specs, a ``key=value`` after a ``:`` spec joined to
    it: ``"flash_attention,galore:rank=64,gap=200"`` → ``["flash_attention",
    "galore:rank=64,gap=200"]``."""
    out: list[str] = []
    for part in _top_level(text, ",", what):
        if not part:
            continue
        continues = "=" in part and ":" not in part and "(" not in part
        if continues and out and ":" in out[-1]:
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def parse_list(
    toggles: str | Iterable[str] | Mapping[str, Mapping[str, Any] | None] | None,
) -> list[tuple[str, dict[str, Any]]]:
    """Toggle specs as ``(id, given parameters)`` pairs, from a spec list (``"a,b:k=v"``),
    several of them, or ``{id: params}``; ids checked, each named once."""
    if not toggles:
        return []
    if isinstance(toggles, Mapping):
        items = [(str(k).strip(), dict(v or {})) for k, v in toggles.items()]
    else:
        texts = [toggles] if isinstance(toggles, str) else [str(t) for t in toggles]
        items = [parse_item(s) for t in texts for s in split_list(t)]
    for tid, _ in items:
        entry(tid)
    ids = [tid for tid, _ in items]
    if len(set(ids)) != len(ids):
        raise ConfigError("toggles", "must name each toggle once", ids)
    return items


def parse_variants(spec: str) -> list[tuple[str, list[tuple[str, dict[str, str]]]]]:
    """``"flash_attention,grad_checkpointing+galore(rank=64,gap=200)"`` → ``[(name, [(id,
    params), ...]), ...]``: commas separate variants, ``+`` combines toggles."""
    out = []
    for part in split_list(spec, "compare"):
        toggles = [parse_item(item) for item in _top_level(part, "+")]
        out.append((part.replace(" ", ""), toggles))
    if not out:
        raise ConfigError("compare", "must name at least one toggle (e.g. flash_attention,galore)", spec)
    return out


def spec_text(toggle_id: str, values: Mapping[str, Any]) -> str:
    """The spec of a toggle with ``values``, naming only those changed from the defaults:
    ``galore(rank=64)``; ``flash_attention``."""
    changed = TOGGLES[toggle_id].changed(values) if toggle_id in TOGGLES else dict(values)
    params = ",".join(f"{k}={v}" for k, v in changed.items())
    return f"{toggle_id}({params})" if params else toggle_id
