"""What the timeline costs at any trace size: ``Timeline.query`` of the whole trace and of
narrow windows, the items it returns, the memory its rows take beside the trace's own
columns, and the bytes ``Timeline.embed`` adds to report.html.

    python benchmarks/timeline.py                     # ~5 MB, 54 MB and ~1 GB traces
    python benchmarks/timeline.py --mb 5 54           # some sizes only
    python benchmarks/timeline.py --keep /tmp/traces  # keep (and reuse) the JSON files

Each trace is a real one (default: the shared 1-rank GPU trace, 15 MB of JSON, 5 steps;
under 12 MB, one rank of the shared 128-rank job)
repeated with its clock shifted and its steps renumbered until it is the size asked
(``scale.write_big``), decoded once with ``read_trace``, then drawn. Query times are the
median of several calls at 1000 pixels: the whole trace, 1 ms windows and 10 ms windows
at spread positions. "rows MB" is what the Timeline holds beside the trace's columns
("columns MB": the events table without its text's characters, as pandas counts it).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import table, write_big

from swift_nb.analysis.timeline.query import Timeline
from swift_nb.analysis.trace.tables import read_trace

TRACES = Path(__file__).resolve().parents[1] / "tests" / "data" / "gpu"  # the shared real traces
SOURCE = TRACES / "gpu_1rank_5steps.json.gz"
#: a smaller real trace (1.6 MB of JSON, one rank of a 128-rank job) for traces under SOURCE's size
SMALL_SOURCE = TRACES / "gpu_128ranks_rank0.json.gz"


def _ms(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), out


def _windows(tl: Timeline, width_us: float, n: int) -> list[tuple[float, float]]:
    span = tl.end_us - tl.start_us - width_us
    return [
        (tl.start_us + span * (k + 0.5) / n, tl.start_us + span * (k + 0.5) / n + width_us) for k in range(n)
    ]


def case(path: Path, width: int) -> list[str]:
    rss = psutil.Process().memory_info().rss
    t = time.perf_counter()
    trace = read_trace(path)
    decode_s = time.perf_counter() - t
    columns = int(trace.events.memory_usage(deep=False).sum())
    t = time.perf_counter()
    tl = Timeline(trace)
    build_s = time.perf_counter() - t
    whole_ms, whole = _ms(lambda: tl.query(None, None, width), 5)
    narrow = [_ms(lambda w=w: tl.query(w[0], w[1], width), 3) for w in _windows(tl, 1000.0, 10)]
    ten = [_ms(lambda w=w: tl.query(w[0], w[1], width), 3) for w in _windows(tl, 10_000.0, 10)]
    t = time.perf_counter()
    embedded = json.dumps(tl.embed(), separators=(",", ":"))
    embed_s = time.perf_counter() - t
    row = [
        f"{path.stat().st_size / 1e6:,.0f}",
        f"{tl.events:,}",
        f"{decode_s:.1f}",
        f"{build_s:.2f}",
        f"{whole_ms:.0f}",
        f"{len(whole):,}",
        f"{statistics.median(m for m, _ in narrow):.1f}",
        f"{max(m for m, _ in narrow):.1f}",
        f"{statistics.median(len(q) for _, q in narrow):,.0f}",
        f"{statistics.median(m for m, _ in ten):.1f}",
        f"{tl.nbytes / 1e6:,.0f}",
        f"{columns / 1e6:,.0f}",
        f"{(psutil.Process().memory_info().rss - rss) / 1e6:,.0f}",
        f"{len(embedded) / 1e6:.1f} ({embed_s:.1f} s)",
    ]
    return row


HEADER = [
    "JSON MB",
    "events",
    "decode s",
    "build s",
    "whole ms",
    "whole items",
    "1 ms: ms",
    "1 ms: max ms",
    "1 ms items",
    "10 ms: ms",
    "rows MB",
    "columns MB",
    "RSS MB",
    "embed MB",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, nargs="+", default=[5, 54, 1024], help="trace sizes (MB of JSON)")
    ap.add_argument("--width", type=int, default=1000, help="pixel columns a query draws")
    ap.add_argument("--source", type=Path, default=SOURCE, help="the real trace to repeat")
    ap.add_argument("--keep", type=Path, help="a folder to keep the synthetic traces in (reused)")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="swift-nb-timeline-"))
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for mb in args.mb:
        path = folder / f"trace_{mb:g}mb.json"
        if not path.exists():
            small = mb < 12 and args.source == SOURCE and SMALL_SOURCE.exists()
            write_big(path, mb, SMALL_SOURCE if small else args.source)
        rows.append(case(path, args.width))
        gc.collect()
    print(table(rows, HEADER))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
