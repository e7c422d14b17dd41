"""The layers import one way (capture → record → analysis → render → front): each module
imports only from the layers below it, and the analysis layer and the vocabulary import no
torch, so they run where torch is not installed (a laptop reading a cluster's traces)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "swift_nb"

#: the entry points at the top: nothing below imports them
FRONT = ("api", "cli", "monitor", "reporting", "trackers", "demo", "notebook", "rerun")

#: package → the swift_nb packages it must not import (anything above it)
FORBIDDEN = {
    "core": (
        "vocabulary",
        "record",
        "capture",
        "analysis",
        "render",
        "importing",
        "toggles",
        "parallel",
        *FRONT,
    ),
    "vocabulary": ("record", "capture", "analysis", "render", "importing", "toggles", "parallel", *FRONT),
    "record": ("capture", "analysis", "render", "importing", "toggles", *FRONT),
    "capture": ("analysis", "render", "importing", "toggles", *FRONT),
    "analysis": ("capture", "render", "importing", "toggles", *FRONT),
    "render": ("capture", "importing", "toggles", *FRONT),
    # the import composes the reading half below it: it writes the report (reporting)
    "importing": ("toggles", "api", "cli", "monitor", "trackers", "demo", "notebook", "rerun"),
}
TORCH_FREE = ("core", "vocabulary", "record", "analysis", "importing")


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def _modules(top: str) -> list[Path]:
    base = PACKAGE / top
    return sorted(base.rglob("*.py")) if base.is_dir() else [PACKAGE / f"{top}.py"]


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(layer):
    bad = []
    for path in _modules(layer):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "swift_nb" and len(parts) > 1 and parts[1] in FORBIDDEN[layer]:
                bad.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("top", TORCH_FREE)
def test_torch_free_modules(top):
    bad = [
        f"{p.relative_to(PACKAGE.parent)} imports {n}"
        for p in _modules(top)
        for n in _imports(p)
        if n.split(".")[0] == "torch"
    ]
    assert not bad, "\n".join(bad)
