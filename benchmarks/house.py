"""The package's shape, as a table: modules at the top, the largest folders, import cycles,
the largest modules and functions, and the tests by tier. Reads source only (nothing is
imported), so it measures any checkout, an older commit's included:

    python benchmarks/house.py                       # this checkout
    git worktree add /tmp/before <commit> && python benchmarks/house.py /tmp/before
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def _module(package: Path, path: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module → the package's modules it imports anywhere in its file (top level,
    ``TYPE_CHECKING``, inside functions); ``from pkg import sub`` names the submodule."""
    modules = {_module(package, p): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
                found |= subs
                if len(subs) < len(node.names) and node.module in modules:
                    found.add(node.module)
        graph[name] = found - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    u = stack.pop()
                    on_stack.discard(u)
                    component.append(u)
                    if u == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def folder_lines(package: Path) -> Counter:
    """Lines of Python directly in each folder (its own modules, not its subfolders')."""
    out: Counter = Counter()
    for path in package.rglob("*.py"):
        out[str(path.parent.relative_to(package.parent))] += len(path.read_text().splitlines())
    return out


def long_functions(package: Path, limit: int = 80) -> list[str]:
    found = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(package.parent)}:{node.name} ({lines})")
    return found


def tests_by_folder(tests: Path) -> Counter:
    out: Counter = Counter()
    for path in tests.rglob("test_*.py"):
        n = sum(
            1 for node in ast.parse(path.read_text()).body if getattr(node, "name", "").startswith("test_")
        )
        out[str(path.parent.relative_to(tests)) or "."] += n
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("root", nargs="?", type=Path, default=HERE, help="a checkout (default: this one)")
    args = parser.parse_args(argv)
    package = args.root / "swift_nb"
    if not package.is_dir():
        print(f"{args.root} has no swift_nb/ folder: give a checkout of the project", file=sys.stderr)
        return 2
    top = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    loops = cycles(import_graph(package))
    folders = folder_lines(package)
    modules = sorted(
        ((len(p.read_text().splitlines()), str(p.relative_to(args.root))) for p in package.rglob("*.py")),
        reverse=True,
    )
    crowded = Counter(str(p.parent.relative_to(args.root)) for p in package.rglob("*.py"))
    print(f"| figure | {args.root} |\n|---|---|")
    print(f"| modules at the top (beside __init__) | {len(top)}: {', '.join(top)} |")
    print(
        f"| import cycles | {len(loops)}{': ' + '; '.join(' ↔ '.join(c) for c in loops) if loops else ''} |"
    )
    print(f"| lines of Python in swift_nb/ | {sum(folders.values())} |")
    print(
        "| five largest folders (their own modules' lines) | "
        + ", ".join(f"{f} {n}" for f, n in folders.most_common(5))
        + " |"
    )
    print("| most modules in one folder | " + ", ".join(f"{f} {n}" for f, n in crowded.most_common(3)) + " |")
    print("| largest modules | " + ", ".join(f"{p} {n}" for n, p in modules[:3]) + " |")
    print(f"| functions over 80 lines | {', '.join(long_functions(package)) or 'none'} |")
    tests = args.root / "tests"
    if tests.is_dir():
        print(
            "| test functions by folder | "
            + ", ".join(f"{f} {n}" for f, n in sorted(tests_by_folder(tests).items()))
            + " |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
