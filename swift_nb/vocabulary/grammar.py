"""The one grammar of a toggle spec (see ``swift_nb.vocabulary``): a toggle, a list of them,
the variants of ``--compare``, and a toggle written back as text."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from swift_nb.core.errors import ConfigError
from swift_nb.vocabulary.entries import TOGGLES, entry


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
