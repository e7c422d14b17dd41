"""Whole-training monitoring: what 100 000 steps cost in memory, and that none is lost.

Each front runs a loop of ``--steps`` steps (each a tiny matmul, so the loop is as fast as
the step hook allows and every per-step structure grows as fast as it can) in a process of
its own, and reports the process's RSS at each quarter and after the record is saved,
as growth over its RSS after the first 1 000 steps, with steps.csv's rows against the steps
taken. What the first steps cost once is a column of its own ("first 1 000"): the session's
start, and the first step boundary's look at the models and the training framework, which
imports torch.distributed's modules (sympy among them: ~60 MB) in a process that had not.
``profile`` saves its record without the analysis (``report=False``); ``monitor``'s
``generate_report()`` always analyses and writes report.html, so its "saved" includes the
report's imports (matplotlib) and figures.

- ``monitor``: ``ResourceMonitor(interval=10)`` (the seeds' whole-training monitoring:
  explicit step hooks, a sample every 10 steps, one a second in the background);
- ``profile``: ``swift_nb.profile()`` with its default schedule (a trace of 3 steps, then
  only the step hook), every ``optimizer.step()`` a boundary.

    python benchmarks/monitoring.py [--steps 100000] [--fronts monitor,profile]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap

LOOP = textwrap.dedent(
    """
    import json, sys, time, psutil, torch, pandas as pd, swift_nb
    front, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    proc = psutil.Process()
    m = torch.nn.Linear(8, 8); o = torch.optim.SGD(m.parameters(), lr=1e-3); x = torch.randn(2, 8)
    marks = {}
    FIRST = 1000
    def step():
        m(x).sum().backward(); o.step(); o.zero_grad()
    for _ in range(200):  # torch's own first-use allocations before the baseline
        step()
    marks["before"] = proc.memory_info().rss
    t0 = time.perf_counter()
    if front == "monitor":
        mon = swift_nb.ResourceMonitor(interval=10, log_dir=out, label="monitor", monitor_gpu=False)
        for k in range(steps):
            mon.step_begin(k); m(x).sum().backward(); mon.step_end(k)
            if (k + 1) % (steps // 4) == 0 or k + 1 == FIRST:
                marks[f"{k + 1}"] = proc.memory_info().rss
        run = mon.generate_report().run
    else:
        with swift_nb.profile(out_dir=out, label="profile", report=False) as run:
            for k in range(steps):
                step()
                if (k + 1) % (steps // 4) == 0 or k + 1 == FIRST:
                    marks[f"{k + 1}"] = proc.memory_info().rss
    marks["saved"] = proc.memory_info().rss
    rows = len(pd.read_csv(run.path / "steps.csv"))
    samples = len(pd.read_csv(run.path / "samples.csv"))
    print(json.dumps({"marks": marks, "rows": rows, "steps": run.summary["steps"], "samples": samples,
                      "wall_s": time.perf_counter() - t0}))
    """
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--fronts", default="monitor,profile")
    args = ap.parse_args()
    mib = 1 << 20
    print(f"{args.steps:,} steps per front; RSS (MiB) grown since step 1 000\n")
    header = [
        "front",
        "first 1 000",
        *[f"{q * args.steps // 4:,}" for q in (1, 2, 3, 4)],
        "saved",
        "steps.csv rows",
        "samples",
        "wall s",
    ]
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for front in args.fronts.split(","):
        with tempfile.TemporaryDirectory() as out:
            done = subprocess.run(
                [sys.executable, "-c", LOOP, front, str(args.steps), out], capture_output=True, text=True
            )
        if done.returncode:
            print(f"{front} | failed: {done.stderr.strip().splitlines()[-1]}")
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        before = r["marks"].pop("before")
        base = r["marks"].pop("1000")
        grown = [f"{(base - before) / mib:+.1f}", *(f"{(v - base) / mib:+.1f}" for v in r["marks"].values())]
        rows = f"{r['rows']:,} of {r['steps']:,}"
        print(" | ".join([front, *grown, rows, f"{r['samples']:,}", f"{r['wall_s']:.0f}"]))


if __name__ == "__main__":
    main()
