"""Overhead of swift_nb on the demo model's training loop (CPU).

Three modes, interleaved round by round so that drift of the machine hits all alike:
  bare     the loop alone
  sampler  resource sampling + step hooks only (Session without the profiler)
  profile  the profiler with the default schedule (wait 1, warmup 2, active 3), sampler and
           step hooks: what swift_nb.profile() captures
Per mode: median and mean step time, the cell's wall time over all steps (capture only;
the analysis and report that follow a profiled cell are timed on their own), and RSS
after each cell (to show that repeated profiled cells do not grow the process).

    python benchmarks/overhead.py [--steps 50] [--rounds 3] [--seq 256] [--layers 4] [--width 256]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import psutil
import torch

from swift_nb.api import ReportAhead, report
from swift_nb.capture.session import Session
from swift_nb.demo import GPT, GPTConfig
from swift_nb.vocabulary.options import ProfileOptions


def cell(model, opt, batches) -> list[float]:
    times = []
    for x, y in batches:
        t = time.perf_counter()
        model(x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()

    torch.manual_seed(0)
    cfg = GPTConfig(
        seq_len=args.seq, n_layer=args.layers, d_model=args.width, n_head=max(1, args.width // 64)
    )
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = [(torch.randint(0, cfg.vocab_size, (args.batch, cfg.seq_len)),) * 2 for _ in range(args.steps)]
    cell(model, opt, batches[:3])  # warm up allocator and kernels
    out = tempfile.mkdtemp(prefix="swift_nb_bench_")
    proc = psutil.Process()

    def bare():
        return cell(model, opt, batches)

    def sampler():
        s = Session(ProfileOptions(out_dir=out), trace=False)
        s.start()
        try:
            return cell(model, opt, batches)
        finally:
            s.stop()

    report_s: list[float] = []

    def profile():
        ahead = ReportAhead()
        session = Session(ProfileOptions(out_dir=out), on_trace=ahead)
        session.start()
        try:
            return cell(model, opt, batches)
        finally:
            session.stop()
            t = time.perf_counter()  # after the cell: analysis, figures, report.html
            ahead.take(session.take_trace_tables())
            report(session.run, figures=ahead.figures)
            report_s.append(time.perf_counter() - t)

    modes = {"bare": bare, "sampler": sampler, "profile": profile}
    steps: dict[str, list[float]] = {m: [] for m in modes}
    walls: dict[str, list[float]] = {m: [] for m in modes}
    rss: dict[str, list[float]] = {m: [] for m in modes}
    names = list(modes)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t = time.perf_counter()
            steps[name] += modes[name]()
            walls[name].append(time.perf_counter() - t)
            rss[name].append(proc.memory_info().rss / 2**20)

    base_step = statistics.median(steps["bare"])
    base_mean = statistics.fmean(steps["bare"])
    base_wall = statistics.median(walls["bare"])
    print(
        f"demo GPT: {args.layers} layers, d={args.width}, seq {args.seq}, batch {args.batch}; "
        f"{args.steps}-step cells, {args.rounds} interleaved rounds; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    print(
        f"{'mode':<8} {'step median':>12} {'x bare':>7} {'step mean':>10} {'x bare':>7} "
        f"{'cell wall':>10} {'x bare':>7}  RSS after each cell (MiB)"
    )
    for name in modes:
        med, mean = statistics.median(steps[name]), statistics.fmean(steps[name])
        wall = statistics.median(walls[name])
        print(
            f"{name:<8} {med * 1e3:>9.1f} ms {med / base_step:>7.3f} {mean * 1e3:>7.1f} ms "
            f"{mean / base_mean:>7.3f} {wall:>8.2f} s {wall / base_wall:>7.3f}  "
            + " ".join(f"{v:.0f}" for v in rss[name])
        )
    print(f"analysis + report.html after each profiled cell: median {statistics.median(report_s):.2f} s")


if __name__ == "__main__":
    main()
