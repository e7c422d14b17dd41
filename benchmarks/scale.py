"""Traces of any size and jobs of many ranks: decode time and memory, import time and
memory summed over every process.

    python benchmarks/scale.py                  # all cases below
    python benchmarks/scale.py --only decode    # one part: decode, job, big
    python benchmarks/scale.py --ranks 16 64 --rank-mb 54 --big-mb 1024

Jobs are built from a real trace (default: the shared 2-rank NCCL trace), its events
repeated with their clock shifted and their ProfilerStep numbers renumbered until a rank
is ``--rank-mb`` MB of JSON, then written once per rank with ``distributedInfo.rank``
renumbered (a gzip of two members: the rank's header, then the events every rank shares).

decode: one trace decoded by ``orjson`` into a dict per event then ``parse_events`` (the
previous path), and by ``read_trace`` (msgspec: byte ranges, then typed structs a batch
at a time), on the real trace and on a ``--decode-mb`` synthetic one; each in a fresh
process, its wall time and peak RSS (``ru_maxrss``).
job: ``swift_nb.import_trace(folder)`` of ``--ranks`` ranks (with its report), in a fresh
process; wall time and the peak of the RSS summed over that process and all its
children (psutil, sampled every 50 ms).
big: one ``--big-mb`` MB JSON trace (plain .json) imported the same way.

HTA (HolisticTraceAnalysis, optional as in hta_compare.py) loads the 16-rank folder with
``TraceAnalysis`` and computes its temporal breakdown, when it is installed here or in the
interpreter ``--hta-python`` names (``python -m venv .venv-hta; .venv-hta/bin/pip install
HolisticTraceAnalysis psutil``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import psutil

SOURCE = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "gpu_nccl_2ranks_rank0.json.gz"
STEP = "ProfilerStep#"
LAST_CPU_S = float("nan")


def _source_path(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    for p in (SOURCE, Path("/work/shared/traces/gpu_nccl_2ranks_rank0.json.gz")):
        if p.exists():
            return p
    return Path(__file__).resolve().parents[1] / "tests" / "data" / "gpu" / "gpu_nccl_2ranks_rank0.json.gz"


def repeated_events(doc: dict, target_bytes: int, stretch: float = 1.0) -> bytes:
    """``doc``'s events repeated (clock shifted past the previous copy, step numbers
    renumbered, ids offset) until they are about ``target_bytes`` of JSON: the text
    between the brackets of ``traceEvents``. ``stretch`` scales every time and duration
    (a slower rank)."""
    events = doc["traceEvents"]
    ts = [e["ts"] for e in events if "ts" in e]
    t0, t1 = min(ts), max(e["ts"] + e.get("dur", 0) for e in events if "ts" in e)
    steps = sorted({int(e["name"][len(STEP) :]) for e in events if str(e.get("name", "")).startswith(STEP)})
    one = len(orjson.dumps(events))
    copies = max(1, round(target_bytes / one))
    parts = []
    for k in range(copies):
        shift = k * (t1 - t0 + 1000.0)
        out = []
        for e in events:
            e = dict(e)
            if "ts" in e:
                e["ts"] = t0 + (e["ts"] - t0 + shift) * stretch
                if "dur" in e:
                    e["dur"] = e["dur"] * stretch
            name = str(e.get("name", ""))
            if name.startswith(STEP):
                e["name"] = f"{STEP}{int(name[len(STEP) :]) + k * len(steps)}"
            if k and e.get("ph") in ("s", "f") and "id" in e:
                e["id"] = e["id"] + k * 10_000_000
            args = e.get("args")
            if k and isinstance(args, dict):
                args = dict(args)
                for key in ("External id", "correlation"):
                    if isinstance(args.get(key), int):
                        args[key] += k * 10_000_000
                e["args"] = args
            out.append(e)
        parts.append(orjson.dumps(out)[1:-1])
    return b",\n".join(parts)


def write_job(
    folder: Path, ranks: int, rank_mb: float, source: Path, slow: dict[int, float] | None = None
) -> int:
    """``ranks`` trace files in ``folder``, each ``rank_mb`` MB of JSON; ``slow``: rank →
    stretch of its clock. Returns one rank's JSON size in bytes."""
    doc = json.loads(gzip.decompress(source.read_bytes()))
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    shared = repeated_events(doc, int(rank_mb * 1e6))
    body = gzip.compress(b"[" + shared + b"]}", compresslevel=1)
    stretched: dict[float, bytes] = {}
    folder.mkdir(parents=True, exist_ok=True)
    size = 0
    for r in range(ranks):
        info = {**meta.get("distributedInfo", {}), "rank": r, "world_size": ranks}
        # json's spacing ("rank": 3), as Kineto writes it: HTA finds a file's rank by that text
        head = json.dumps({**meta, "distributedInfo": info})[:-1].encode() + b', "traceEvents": '
        factor = (slow or {}).get(r)
        if factor:
            if factor not in stretched:
                stretched[factor] = gzip.compress(
                    b"[" + repeated_events(doc, int(rank_mb * 1e6), factor) + b"]}", compresslevel=1
                )
            rank_body = stretched[factor]
        else:
            rank_body = body
        (folder / f"rank{r}.json.gz").write_bytes(gzip.compress(head, compresslevel=1) + rank_body)
        size = len(head) + len(shared) + 3
    return size


def write_big(path: Path, mb: float, source: Path) -> int:
    """One plain-JSON trace of about ``mb`` MB."""
    doc = json.loads(gzip.decompress(source.read_bytes()))
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    with open(path, "wb") as f:
        f.write(orjson.dumps(meta)[:-1] + b', "traceEvents": [')
        f.write(repeated_events(doc, int(mb * 1e6)))
        f.write(b"]}")
    return path.stat().st_size


def _in_shm() -> int:
    """Bytes of the import's files in memory (``importing.halves`` writes the second half of a
    large trace's events to /dev/shm): tmpfs pages no process's RSS counts."""
    total = 0
    for f in Path("/dev/shm").glob("swift_nb-*"):
        try:
            total += f.stat().st_blocks * 512
        except OSError:
            pass
    return total


def _rss_shmem(pid: int) -> int:
    """Of a process's RSS, the shared-memory pages it maps (``RssShmem``: /dev/shm files)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssShmem:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _tree(proc: psutil.Process, cpu: dict[int, float]) -> int:
    """RSS summed over ``proc`` and its descendants, with the import's files in /dev/shm;
    ``cpu``: each one's CPU seconds so far, updated (a worker's last reading stays when it
    is gone)."""
    total = _in_shm()
    for p in [proc, *proc.children(recursive=True)]:
        try:
            with p.oneshot():
                total += p.memory_info().rss - _rss_shmem(p.pid)  # mapped tmpfs pages: counted once, above
                t = p.cpu_times()
                cpu[p.pid] = t.user + t.system
        except psutil.Error:
            pass
    return total


def measured(code: str, python: str | None = None) -> tuple[float, int, str]:
    """Run ``code`` in a fresh Python; (wall s, peak RSS summed over its process tree,
    its last line of output). The CPU seconds of that tree (sampled every 50 ms) are in
    ``LAST_CPU_S``: on a machine shared with other work, wall time says less."""
    global LAST_CPU_S
    t = time.perf_counter()
    proc = subprocess.Popen(
        [python or sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    ps, peak, cpu = psutil.Process(proc.pid), 0, {}
    while proc.poll() is None:
        try:
            peak = max(peak, _tree(ps, cpu))
        except psutil.Error:
            pass
        time.sleep(0.05)
    wall = time.perf_counter() - t
    LAST_CPU_S = sum(cpu.values())
    out = proc.stdout.read().decode().strip().splitlines()
    if proc.returncode:
        raise SystemExit(f"failed ({proc.returncode}):\n" + "\n".join(out[-30:]))
    return wall, peak, out[-1] if out else ""


DECODERS = {
    "orjson + a dict per event": "t = parse_events(read_trace_document(P)['traceEvents'])",
    "read_trace (msgspec, batched structs)": "t = read_trace(P)",
}
_PEAK = (
    "import resource, time\nimport psutil\n"
    "from swift_nb.analysis.trace.tables import read_trace_document, parse_events, read_trace\n"
    "P = {path!r}\nbase = psutil.Process().memory_info().rss\ns = time.perf_counter()\n{body}\n"
    "print(time.perf_counter() - s, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, len(t.events), base)"
)


def decode_case(path: Path) -> list[list[str]]:
    rows = []
    for name, body in DECODERS.items():
        _, _, line = measured(_PEAK.format(path=str(path), body=body))
        secs, peak, events, base = line.split()
        rows.append(
            [
                path.name,
                name,
                f"{int(events):,}",
                f"{float(secs):.2f}",
                f"{int(peak) / 2**20:,.0f}",
                f"{(int(peak) - int(base)) / 2**20:,.0f}",
            ]
        )
    return rows


def import_case(folder: Path, report: bool = True, out: Path | None = None) -> tuple[float, int, str]:
    """``import_trace`` of ``folder`` in a fresh process, into a temporary folder, or into
    ``out`` where the run stays (its folder ends the output's last line, after ``·``)."""
    into = "tempfile.TemporaryDirectory()" if out is None else f"contextlib.nullcontext({str(out)!r})"
    code = (
        "import contextlib, sys, tempfile, time\nimport swift_nb\n"
        f"with {into} as out:\n"
        f"    run = swift_nb.import_trace({str(folder)!r}, out, report={report})\n"
        "    print(len(run.ranks) or 1, 'ranks;', run.summary.get('steps'), 'steps ·', run.path)"
    )
    return measured(code)


def reopen_case(run_folder: str) -> tuple[float, int, str]:
    """The saved run reopened in a fresh process and its report written again
    (``swift_nb.report(folder)``, as ``swift-nb report`` does): python's start included."""
    code = (
        "import swift_nb\n"
        f"r = swift_nb.report({run_folder!r})\n"
        "print('analysed' if r.analysis is not None else 'not analysed', '·', len(r.run.problems), 'problems')"
    )
    return measured(code)


def hta_case(folder: Path, python: str | None = None) -> tuple[float, int] | None:
    """HTA's load and temporal breakdown of ``folder``: with ``python`` (an interpreter
    where HTA is installed, e.g. its own venv: it pins older pandas), else in this one."""
    if python is None:
        try:
            import hta  # noqa: F401
        except ImportError:
            return None
    code = (
        "import logging\nfrom hta.trace_analysis import TraceAnalysis\nlogging.getLogger('hta').setLevel(40)\n"
        f"a = TraceAnalysis(trace_dir={str(folder)!r})\na.get_temporal_breakdown(visualize=False)\nprint('ok')"
    )
    wall, peak, _ = measured(code, python)
    return wall, peak


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths))
    return "\n".join(
        [fmt.format(*header), "  ".join("-" * w for w in widths), *(fmt.format(*r) for r in rows)]
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["decode", "job", "big"], action="append")
    ap.add_argument("--source", help="the trace jobs are built from")
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--rank-mb", type=float, default=54.0)
    ap.add_argument("--decode-mb", type=float, default=300.0)
    ap.add_argument("--big-mb", type=float, default=1024.0)
    ap.add_argument("--no-report", action="store_true", help="import without writing the report")
    ap.add_argument("--hta-python", help="a Python with HolisticTraceAnalysis installed (default: this one)")
    args = ap.parse_args()
    parts = set(args.only or ["decode", "job", "big"])
    source = _source_path(args.source)
    print(f"source trace: {source}; {os.cpu_count()} cores; {psutil.virtual_memory().total / 2**30:.0f} GiB")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if "decode" in parts:
            synthetic = tmp / "synthetic.json.gz"
            doc = json.loads(gzip.decompress(source.read_bytes()))
            meta = {k: v for k, v in doc.items() if k != "traceEvents"}
            with gzip.open(synthetic, "wb", compresslevel=1) as f:
                f.write(orjson.dumps(meta)[:-1] + b', "traceEvents": [')
                f.write(repeated_events(doc, int(args.decode_mb * 1e6)))
                f.write(b"]}")
            rows = decode_case(source) + decode_case(synthetic)
            print("\nDecoding one trace (fresh process each)")
            print(
                table(
                    rows,
                    ["trace", "decoder", "events", "time (s)", "peak RSS (MiB)", "over the imports (MiB)"],
                )
            )
            print(
                "(time after the imports; swift_nb's imports, torch among them, are the RSS before decoding)"
            )
        results = {}
        if "job" in parts:
            rows = []
            for n in args.ranks:
                folder = tmp / f"job{n}"
                size = write_job(folder, n, args.rank_mb, source)
                wall, peak, line = import_case(folder, report=not args.no_report)
                results[n] = (wall, peak)
                rows.append(
                    [
                        f"{n} ranks × {size / 1e6:.0f} MB",
                        f"{wall:.1f}",
                        f"{LAST_CPU_S:.1f}",
                        f"{peak / 2**30:.2f}",
                        line.rpartition(" · ")[0],
                    ]
                )
                if n == 16:
                    theirs = hta_case(folder, args.hta_python)
                    if theirs is not None:
                        rows.append(
                            [
                                "  HTA: load + temporal breakdown",
                                f"{theirs[0]:.1f}",
                                f"{LAST_CPU_S:.1f}",
                                f"{theirs[1] / 2**30:.2f}",
                                f"swift_nb {theirs[0] / wall:.1f}× faster",
                            ]
                        )
                for f in folder.iterdir():
                    f.unlink()
            what = "without its report" if args.no_report else "with its report"
            print(f"\nImporting a job (import_trace {what}; CPU and RSS summed over the process tree)")
            print(table(rows, ["job", "wall (s)", "CPU (s)", "peak RSS (GiB)", "imported"]))
            print(f"(load average while it ran: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
            if len(results) >= 2:
                lo, hi = min(results), max(results)
                print(
                    f"memory at {hi} ranks / at {lo} ranks: {results[hi][1] / results[lo][1]:.2f}×; "
                    f"targets: 16 ranks ≤ 20 s and ≤ 1.5 GiB, 64 ranks ≤ 1.2× the 16-rank memory"
                )
        if "big" in parts:
            big_dir = tmp / "big"
            big_dir.mkdir()
            size = write_big(big_dir / "big.json", args.big_mb, source)
            runs = big_dir / "runs"
            wall, peak, line = import_case(big_dir / "big.json", report=not args.no_report, out=runs)
            what = "without its report" if args.no_report else "with its report"
            rows = [
                [
                    f"{size / 1e9:.2f} GB JSON",
                    "import",
                    f"{wall:.1f}",
                    f"{LAST_CPU_S:.1f}",
                    f"{peak / 2**30:.2f}",
                    line.rpartition(" · ")[0],
                ]
            ]
            if not args.no_report:
                wall, peak, again = reopen_case(line.rpartition(" · ")[2])
                rows.append(
                    [
                        "",
                        "reopen: report(folder)",
                        f"{wall:.1f}",
                        f"{LAST_CPU_S:.1f}",
                        f"{peak / 2**30:.2f}",
                        again,
                    ]
                )
            print(f"\nImporting one large trace, {what}, then reopening it (targets at 1 GB of JSON:")
            print("import with its report ≤ 15 s and ≤ 2 GiB; reopen ≤ 3 s; python's start included)")
            print(table(rows, ["trace", "", "wall (s)", "CPU (s)", "peak RSS + shm (GiB)", "imported"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
