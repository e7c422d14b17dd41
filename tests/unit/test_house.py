"""The package's shape, as docs/architecture.md describes it: entry points at the top, one
folder per feature, no import cycle, small modules and functions, and each name of
torch.profiler's spelled in one place."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "swift_nb"
SCRIPTS = PACKAGE.parent / "scripts"

#: the package's top: its entry points, nothing else
TOP_MODULES = {"api", "cli", "demo", "model_forecast", "monitor", "reporting", "trackers"}
MAX_TOP_MODULES = 8
MAX_MODULES_PER_FOLDER = 20
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py")) + sorted(SCRIPTS.rglob("*.py"))


def _house():
    """benchmarks/house.py, the one reading of the package's imports (its table is the
    benchmark; these tests hold its figures to the limits)."""
    spec = importlib.util.spec_from_file_location("house", PACKAGE.parent / "benchmarks" / "house.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


house = _house()


def test_the_top_holds_only_the_entry_points():
    top = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert top == TOP_MODULES and len(top) <= MAX_TOP_MODULES


def test_no_import_cycle():
    graph = house.import_graph(PACKAGE)
    assert graph["swift_nb.importing.rank"] and not house.cycles(graph), house.cycles(graph)


def test_the_cycle_check_finds_a_cycle():
    assert house.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_folder_holds_more_than_twenty_modules():
    crowded = {
        str(d.relative_to(PACKAGE.parent)): n
        for d in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir())]
        if (n := len(list(d.glob("*.py")))) > MAX_MODULES_PER_FOLDER
    }
    assert not crowded, crowded


def test_the_timeline_is_one_package():
    timeline = PACKAGE / "analysis" / "timeline"
    assert {"query.py", "tracks.py", "counters.py", "places.py", "ranks.py"} <= {
        p.name for p in timeline.glob("*.py")
    }
    assert not [p.name for p in PACKAGE.rglob("timeline_*.py") if p.parent.name == "analysis"]


def test_modules_and_functions_stay_small():
    long_modules, long_functions = [], []
    for path in _sources():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.append(str(path.relative_to(PACKAGE.parent)))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(PACKAGE.parent)}:{node.name} ({lines})")
    assert not long_modules and not long_functions, (long_modules, long_functions)


def test_profilerstep_is_spelled_in_code_in_one_module():
    """Outside comments and docstrings, torch.profiler's step name lives in trace_names."""
    spelled = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            is_text = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if is_text and id(node) not in docstrings and "ProfilerStep" in node.value:
                spelled.add(path.relative_to(PACKAGE).as_posix())
    for path in (PACKAGE / "render" / "timeline" / "static").glob("*.js"):
        code = re.sub(r"//[^\n]*|/\*.*?\*/", "", path.read_text(), flags=re.S)
        if "ProfilerStep" in code:
            spelled.add(path.relative_to(PACKAGE).as_posix())
    assert spelled == {"core/trace_names.py"}, spelled
