"""What a profiled cell costs the user: from Shift-Enter to every result shown, against the
same cell without the magic (CPU, the demo GPT of benchmarks/overhead.py).

Cells, interleaved round by round so that drift of the machine hits all alike:
  bare     the training loop alone
  capture  swift_nb's capture only (steps, samples, the profiler with the default schedule
           wait 1, warmup 2, active 3, the trace written, the memory replay)
  full     capture, then the analysis, report.html, the results panel and the static
           outputs: everything a profiled cell does before its results are visible
Then: the cost of ``import swift_nb`` and ``%load_ext swift_nb`` beyond torch's import,
the sampler's cost per sample, a ~50 MB trace analyzed and reported right after capture
and cold from its run folder (with HolisticTraceAnalysis's parse of the same file), the
fixed cost of an isolated rerun over the bare cell, and (``--ranks``) the gather of a
1000-step job of 4 ranks. Prints a Markdown table.

    python benchmarks/cost.py [--cell-s 15] [--rounds 3] [--threads N] [--big-layers 14] [--no-hta] [--no-rerun] [--ranks]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

from swift_nb.api import ReportAhead, _draw_elsewhere, finish, report
from swift_nb.capture.resources.sampler import Sampler
from swift_nb.capture.session import Session
from swift_nb.demo import GPT, GPTConfig
from swift_nb.record import REPORT_FILE, load_run, tables_path
from swift_nb.vocabulary.options import ProfileOptions

HERE = Path(__file__).resolve().parent
SCHEDULE_STEPS = 6  # wait 1 + warmup 2 + active 3: the steps after these are not recorded


def _bench_module(name: str):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cell = _bench_module("overhead").cell  # the same training cell as benchmarks/overhead.py


def show(reported) -> None:
    """What the magic shows after a cell: the results panel and the static outputs
    (displayed into nothing: a notebook's front end is not part of this process)."""
    from swift_nb.notebook import panel

    shown = []
    displayed, panel.display = panel.display, lambda obj, **kw: shown.append(obj)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            panel.show_run(reported.run, reported.sections, panel=True)
    finally:
        panel.display = displayed


def _python(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


IMPORT_CODE = "import time, torch\nt = time.perf_counter()\nimport swift_nb\nprint(time.perf_counter() - t)"
LOAD_EXT_CODE = (
    "import time, torch\nfrom IPython.core.interactiveshell import InteractiveShell\n"
    "shell = InteractiveShell.instance()\nt = time.perf_counter()\n"
    "shell.run_line_magic('load_ext', 'swift_nb')\nprint(time.perf_counter() - t)"
)


def import_costs(repeats: int) -> tuple[float, float]:
    imp = statistics.median(_python(IMPORT_CODE) for _ in range(repeats))
    ext = statistics.median(_python(LOAD_EXT_CODE) for _ in range(repeats))
    return imp, ext


def sampler_cost(n: int = 300) -> float:
    s = Sampler(None, lambda: 0, monitor_gpu=torch.cuda.is_available())
    s._sample("periodic")
    t = time.perf_counter()
    for _ in range(n):
        s._sample("periodic")
    return (time.perf_counter() - t) / n


def big_trace(layers: int, active: int, after: int, hta: bool, root: str) -> dict:
    """A large trace: analysis + report right after capture and cold from the folder. The
    cell runs ``after`` steps past the profiler's schedule, as a training cell does."""
    torch.manual_seed(0)
    cfg = GPTConfig(seq_len=128, n_layer=layers, d_model=128, n_head=4, vocab_size=512)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, cfg.vocab_size, (8, cfg.seq_len))
    ahead = ReportAhead()  # what the API hands a profiled run: tables and figures while it runs
    session = Session(ProfileOptions(wait=0, warmup=1, active=active, out_dir=root), on_trace=ahead)
    session.start()
    for _ in range(active + 1 + after):
        model(x, x).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    t = time.perf_counter()
    run = session.stop()
    out = {"finish_s": time.perf_counter() - t}
    t = time.perf_counter()
    ahead.take(session.take_trace_tables())
    reported = report(run, figures=ahead.figures, drawing=_draw_elsewhere(run, timeline_png=True))
    show(reported)
    out["warm_s"] = time.perf_counter() - t
    run = reported.run
    import gzip

    with gzip.open(run.trace_path, "rb") as f:
        out["mb"] = len(f.read()) / 1e6
    out["events"] = run.summary["trace_events"]
    colds, bare = [], []
    for _ in range(2):  # the run folder as a profiled cell left it
        t = time.perf_counter()
        show(report(load_run(run.path)))
        colds.append(time.perf_counter() - t)
    for _ in range(2):  # the trace alone: nothing derived from it kept (an imported trace)
        tables_path(run.trace_path).unlink(missing_ok=True)
        (run.path / REPORT_FILE).unlink(missing_ok=True)
        t = time.perf_counter()
        show(report(load_run(run.path)))
        bare.append(time.perf_counter() - t)
    out["cold_s"], out["trace_only_s"] = min(colds), min(bare)
    if hta:
        with tempfile.TemporaryDirectory() as d:
            shutil.copy(run.trace_path, Path(d) / "rank0.json.gz")
            try:
                from hta.trace_analysis import TraceAnalysis

                t = time.perf_counter()
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    TraceAnalysis(trace_dir=d)
                out["hta_s"] = time.perf_counter() - t
            except Exception as e:  # HTA is optional
                out["hta_s"] = f"failed ({type(e).__name__})"
    return out


def rerun_cost(steps: int) -> float:
    rerun = _bench_module("rerun")
    from swift_nb.rerun import run_variants

    with tempfile.TemporaryDirectory() as root:
        setup_s, cell_s = rerun.bare(steps)
        t = time.perf_counter()
        (outcome,) = run_variants(
            [rerun.SETUP],
            rerun.CELL.format(steps=steps),
            "--wait 0 --warmup 1 --active 2",
            [],
            Path(root) / "r",
        )
        total = time.perf_counter() - t
    assert outcome.status == "ok", outcome
    return total - setup_s - cell_s


def gather_cost() -> tuple[float, float]:
    ranks = _bench_module("ranks")
    with tempfile.TemporaryDirectory() as tmp:
        run, wall = ranks.launch("ddp", 4, 1000, Path(tmp))
    return run.summary["gather_s"], wall


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}×"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cell-s", type=float, default=15.0, help="the bare cell's length (s)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big-layers", type=int, default=14, help="layers of the large trace's GPT (~50 MB)")
    ap.add_argument("--big-active", type=int, default=8)
    ap.add_argument("--big-after", type=int, default=6, help="steps the large trace's cell runs after it")
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--no-rerun", action="store_true")
    ap.add_argument("--ranks", action="store_true", help="also gather a 1000-step job of 4 ranks")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch's intra-op threads (default torch's: every core); 1 on a 2-core machine leaves a core free, "
        "as a GPU host's CPU mostly is",
    )
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(f"torch threads: {torch.get_num_threads()}")

    imp_s, ext_s = import_costs(3)

    torch.manual_seed(0)
    cfg = GPTConfig(seq_len=256, n_layer=4, d_model=256, n_head=4)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sample = [(torch.randint(0, cfg.vocab_size, (8, cfg.seq_len)),) * 2 for _ in range(8)]
    per_step = statistics.median(cell(model, opt, sample)[2:])
    n_steps = max(SCHEDULE_STEPS + 4, round(args.cell_s / per_step))
    batches = [(torch.randint(0, cfg.vocab_size, (8, cfg.seq_len)),) * 2 for _ in range(n_steps)]
    root = tempfile.mkdtemp(prefix="swift_nb_cost_")
    proc = psutil.Process()
    tail_s: list[float] = []
    first_s: list[float] = []
    hook_s: list[float] = []

    def bare():
        return cell(model, opt, batches)

    def capture():
        s = Session(ProfileOptions(out_dir=root, report=False))
        s.start()
        try:
            return cell(model, opt, batches)
        finally:
            run = s.stop()
            hooks = run.steps["overhead_s"].iloc[SCHEDULE_STEPS + 2 :]
            hook_s.extend(hooks.tolist())

    def full():
        s = Session(ProfileOptions(out_dir=root), on_trace=ReportAhead())
        s.start()
        try:
            return cell(model, opt, batches)
        finally:
            t = time.perf_counter()
            # as the magic: the Summary and verdict shown once analysed, the helper drawing
            # the static timeline too
            reported = finish(
                s, on_analysed=lambda r, sections: first_s.append(time.perf_counter() - t), timeline_png=True
            )
            show(reported)
            tail_s.append(time.perf_counter() - t)

    modes = {"bare": bare, "capture": capture, "full": full}
    steps = {m: [] for m in modes}
    walls = {m: [] for m in modes}
    rss = {m: [] for m in modes}
    names = list(modes)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t = time.perf_counter()
            steps[name].append(modes[name]())
            walls[name].append(time.perf_counter() - t)
            rss[name].append(proc.memory_info().rss / 2**20)

    def outside(name):  # steps the profiler does not record (after its schedule)
        return [s for times in steps[name] for s in times[SCHEDULE_STEPS + 2 :]]

    sample_s = sampler_cost()
    big = big_trace(args.big_layers, args.big_active, args.big_after, not args.no_hta, root)
    rerun_s = None if args.no_rerun else rerun_cost(10)
    gather = gather_cost() if args.ranks else None

    bare_wall = statistics.median(walls["bare"])
    bare_out = statistics.median(outside("bare"))
    print(
        f"demo GPT 4 layers, d=256, seq 256, batch 8; {n_steps}-step cells (~{bare_wall:.1f} s bare), "
        f"{args.rounds} interleaved rounds; torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} CPUs\n"
    )
    print("| figure | measured | target |")
    print("|---|---|---|")
    rows = [
        ("bare cell (median wall)", f"{bare_wall:.2f} s", ""),
        (
            "bare cells' spread, slowest / fastest (the noise floor of the ratios below)",
            _ratio(max(walls["bare"]), min(walls["bare"])),
            "",
        ),
        (
            "capture only: cell wall / bare",
            _ratio(statistics.median(walls["capture"]), bare_wall),
            "",
        ),
        (
            "whole profiled cell, results shown / bare",
            _ratio(statistics.median(walls["full"]), bare_wall),
            "≤ 1.05×",
        ),
        (
            "capture: median step outside the schedule / bare's",
            _ratio(statistics.median(outside("capture")), bare_out),
            "≤ 1.02×",
        ),
        ("step hook per unrecorded step (median)", f"{statistics.median(hook_s) * 1e6:.0f} µs", ""),
        (
            "step hook / the median unrecorded step (the same ratio, free of the machine's drift)",
            _ratio(bare_out + statistics.median(hook_s), bare_out),
            "≤ 1.02×",
        ),
        ("last step → Summary and verdict shown (median)", f"{statistics.median(first_s):.2f} s", "≤ 0.3 s"),
        ("last step → every result shown (median)", f"{statistics.median(tail_s):.2f} s", ""),
        (
            f"{big['mb']:.0f} MB trace ({big['events']:,} events): capture's finish after the last step "
            f"(the cell ran {args.big_after} steps past the schedule)",
            f"{big['finish_s']:.2f} s",
            "",
        ),
        (
            f"{big['mb']:.0f} MB trace: last step → results (capture's finish, analysis, report, outputs)",
            f"{big['finish_s'] + big['warm_s']:.2f} s",
            "≤ 2 s",
        ),
        (
            f"{big['mb']:.0f} MB trace: analysis + report + outputs cold from its run folder",
            f"{big['cold_s']:.2f} s",
            "≤ 2 s",
        ),
        (
            f"{big['mb']:.0f} MB trace: the same from the trace alone (decoded, nothing kept from before)",
            f"{big['trace_only_s']:.2f} s",
            "",
        ),
    ]
    if "hta_s" in big:
        hta = big["hta_s"]
        rows.append(
            (
                "HolisticTraceAnalysis: parse of the same file",
                f"{hta:.2f} s" if isinstance(hta, float) else hta,
                "",
            )
        )
    rows += [
        ("`import swift_nb` beyond torch", f"{imp_s:.2f} s", ""),
        ("`%load_ext swift_nb` beyond torch (IPython shell up)", f"{ext_s:.2f} s", ""),
        ("sampler, per sample", f"{sample_s * 1e6:.0f} µs", ""),
    ]
    if rerun_s is not None:
        rows.append(("isolated rerun: fixed cost over the bare setup + cell", f"{rerun_s:.2f} s", ""))
    if gather is not None:
        rows.append(
            (
                "gather of a 1000-step 4-rank DDP job on rank 0",
                f"{gather[0]:.2f} s (job {gather[1]:.0f} s)",
                "",
            )
        )
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(
        "\nRSS after each cell (MiB): "
        + "; ".join(f"{m} " + " ".join(f"{v:.0f}" for v in rss[m]) for m in modes)
    )
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
