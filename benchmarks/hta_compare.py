"""swift_nb's GPU analysis side by side with HolisticTraceAnalysis (HTA) on real CUDA traces.

For each trace (default: the four real traces in tests/data/gpu), prints HTA's temporal
breakdown (idle, compute, non-compute %) and communication/compute overlap next to
``swift_nb.analysis.device.device_summary``'s, their difference in percentage points, and
the time each takes to parse the trace and compute them: HTA's ``TraceAnalysis`` load plus
``get_temporal_breakdown`` and ``get_comm_comp_overlap``; swift_nb's ``load_trace_file``
cold (its cached tables deleted first) plus ``device_summary``. Each trace is copied into a
directory of its own for both (HTA reads a directory of rank traces, the rank from each
file's ``distributedInfo``). Times are the median of ``--repeats`` runs.

A second pass runs HTA with ``HTA_DISABLE_NS_ROUNDING=1``: HTA rounds nanosecond-resolution
timestamps inward to whole microseconds (start up, end down), which shortens every kernel
by up to 1 µs; swift_nb keeps the trace's timestamps. The column ``Δ no rounding`` is what
remains of the difference without that rounding (see docs/gpu_analysis.md).

HTA is an optional dependency: ``pip install 'swift_nb[bench]'`` (or
``pip install HolisticTraceAnalysis``); should it not install next to this pandas and numpy,
give it its own environment (``python -m venv .venv-hta``) with swift_nb installed there too.

    python benchmarks/hta_compare.py [TRACE.json.gz ...] [--repeats 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from swift_nb.analysis.device import device_summary
from swift_nb.analysis.trace.tables import load_trace_file
from swift_nb.record import tables_path

TRACES = Path(__file__).resolve().parents[1] / "tests" / "data" / "gpu"
METRICS = [
    ("idle %", "idle_time_pctg", "device_idle_pct"),
    ("compute %", "compute_time_pctg", "device_compute_pct"),
    ("non-compute %", "non_compute_time_pctg", "device_non_compute_pct"),
    ("comm/compute overlap %", "comp_comm_overlap_pctg", "comm_compute_overlap_pct"),
]


def hta_run(trace_dir: Path, exact: bool = False) -> tuple[dict, float]:
    """HTA's numbers for the one rank in ``trace_dir`` and the seconds to load and compute
    them; ``exact``: with HTA's rounding of nanosecond timestamps turned off."""
    from hta.trace_analysis import TraceAnalysis

    before = os.environ.get("HTA_DISABLE_NS_ROUNDING")
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1" if exact else "0"
    try:
        with warnings.catch_warnings():
            # HTA divides 0 by 0 for the overlap of a trace without communication kernels
            warnings.simplefilter("ignore", RuntimeWarning)
            t = time.perf_counter()
            analysis = TraceAnalysis(trace_dir=str(trace_dir))
            breakdown = analysis.get_temporal_breakdown(visualize=False)
            overlap = analysis.get_comm_comp_overlap(visualize=False)
            seconds = time.perf_counter() - t
    finally:
        if before is None:
            os.environ.pop("HTA_DISABLE_NS_ROUNDING")
        else:
            os.environ["HTA_DISABLE_NS_ROUNDING"] = before
    row = {**breakdown.iloc[0].to_dict(), **overlap.iloc[0].to_dict()}
    return {name: float(row[key]) for name, key, _ in METRICS}, seconds


def hta_kernel_fill(trace_dir: Path) -> dict:
    """The kernel figures of ``analysis.kernels`` computed from HTA's own parse of the trace
    (its ``est_occupancy`` and ``blocks_per_sm`` columns, its ``iteration`` per kernel, its
    durations unrounded): the kernels of the recorded steps, weighted by their time."""
    from hta.configs.parser_config import ParserConfig
    from hta.trace_analysis import TraceAnalysis

    cfg = ParserConfig.get_default_cfg()
    wanted = ("est_occupancy", "blocks_per_sm")
    cfg.add_args([a for a in ParserConfig.get_all_available_args().values() if a.name in wanted])
    ParserConfig.set_default_cfg(cfg)
    before = os.environ.get("HTA_DISABLE_NS_ROUNDING")
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    try:
        t = TraceAnalysis(trace_dir=str(trace_dir), include_last_profiler_step=True).t
    finally:
        if before is None:
            os.environ.pop("HTA_DISABLE_NS_ROUNDING")
        else:
            os.environ["HTA_DISABLE_NS_ROUNDING"] = before
    df = t.get_trace(next(iter(t.get_all_traces())))
    kernel = t.symbol_table.get_sym_id_map()["kernel"]
    k = df[(df["cat"] == kernel) & (df["stream"] > 0) & (df["iteration"] >= 0)]
    dur = k["dur"].astype(float)
    occ = k["est_occupancy"].astype(float)
    blocks = k["blocks_per_sm"].astype(float)
    has_occ = occ >= 0
    return {
        "occupancy %": float((occ[has_occ] * dur[has_occ]).sum() / dur[has_occ].sum()),
        "under-filled %": float(100 * dur[blocks < 1].sum() / dur.sum()),
    }


def kernel_rows(folder: Path, trace: Path, name: str) -> list[list[str]]:
    """HTA's kernel figures beside ``analysis.kernels.fill_summary``'s on one trace."""
    from swift_nb.analysis.kernels import fill_summary

    theirs = hta_kernel_fill(folder)
    summary = fill_summary(load_trace_file(trace))
    ours = {
        "occupancy %": summary.get("kernel_occupancy_pct"),
        "under-filled %": summary.get("kernel_under_filled_pct"),
    }
    return [[name, m, _num(theirs[m]), _num(ours[m]), _num(_diff(theirs[m], ours[m]))] for m in theirs]


def swift_run(trace: Path) -> tuple[dict, float, float]:
    """swift_nb's numbers, and the seconds to parse the trace cold and to compute them."""
    tables_path(trace).unlink(missing_ok=True)
    t = time.perf_counter()
    tables = load_trace_file(trace)
    parsed = time.perf_counter()
    summary = device_summary(tables)
    done = time.perf_counter()
    return {name: summary[key] for name, _, key in METRICS}, parsed - t, done - parsed


def _num(value) -> str:
    return "–" if value is None or value != value else f"{round(value, 2) + 0.0:.2f}"  # no "-0.00"


def _diff(a, b) -> float | None:
    if a is None or b is None or a != a or b != b:
        return None
    return b - a


def table(rows: list[list[str]], header: list[str]) -> str:
    """A plain-text table, first column left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(r):
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, rows)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="*", type=Path, help="trace files (default: tests/data/gpu/*.json.gz)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    try:
        import hta  # noqa: F401
    except ImportError:
        print(
            "HolisticTraceAnalysis is not installed: pip install 'swift_nb[bench]' "
            "(or pip install HolisticTraceAnalysis; if it conflicts with this environment's pandas or "
            "numpy, python -m venv .venv-hta, then install swift_nb and HolisticTraceAnalysis there and "
            "run this script with .venv-hta/bin/python)",
            file=sys.stderr,
        )
        return 2
    logging.getLogger("hta").setLevel(logging.ERROR)
    traces = args.traces or sorted(TRACES.glob("*.json.gz"))
    compare, timing, kernels, worst = [], [], [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for trace in traces:
            name = trace.name.removesuffix(".json.gz")
            folder = Path(tmp) / name
            folder.mkdir()
            copy = folder / trace.name
            shutil.copy(trace, copy)
            hta_times, parse_times, summary_times = [], [], []
            for _ in range(args.repeats):
                ours, parse_s, summary_s = swift_run(copy)
                parse_times.append(parse_s)
                summary_times.append(summary_s)
                theirs, s = hta_run(folder)
                hta_times.append(s)
            exact, _ = hta_run(folder, exact=True)
            kernels += kernel_rows(folder, copy, name)
            tables_path(copy).unlink(missing_ok=True)
            for label, _, _ in METRICS:
                d, d_exact = _diff(theirs[label], ours[label]), _diff(exact[label], ours[label])
                worst = max(worst, abs(d or 0.0))
                compare.append([name, label, _num(theirs[label]), _num(ours[label]), _num(d), _num(d_exact)])
            hta_s = statistics.median(hta_times)
            parse_s, summary_s = statistics.median(parse_times), statistics.median(summary_times)
            swift_s = parse_s + summary_s
            timing.append(
                [
                    name,
                    f"{hta_s:.3f}",
                    f"{parse_s:.3f}",
                    f"{summary_s:.3f}",
                    f"{swift_s:.3f}",
                    f"{hta_s / swift_s:.1f}×",
                ]
            )
    print(table(compare, ["trace", "metric", "HTA", "swift_nb", "Δ pp", "Δ no rounding"]))
    print(f"\nlargest difference: {worst:.2f} percentage points\n")
    print("kernel figures of the recorded steps (analysis.kernels; HTA's parse, unrounded):")
    print(table(kernels, ["trace", "metric", "from HTA's parse", "swift_nb", "Δ pp"]))
    print()
    print(
        table(
            timing,
            [
                "trace",
                "HTA load + calls (s)",
                "swift_nb cold load (s)",
                "device_summary (s)",
                "swift_nb total (s)",
                "HTA / swift_nb",
            ],
        )
    )
    print(f"\n(median of {args.repeats} runs each; HTA {_hta_version()})")
    return 0


def _hta_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("HolisticTraceAnalysis")
    except PackageNotFoundError:
        return "(version unknown)"


if __name__ == "__main__":
    sys.exit(main())
