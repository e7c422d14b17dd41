"""What a short script pays for profiling its first run: a data-bound loop (a loader that
waits a few ms per sample, a small model, the CPU mostly idle), each round in fresh
interpreters, as ``python train.py`` runs it.

Per round, two processes, one after the other:
  bare      the loop twice, nothing else
  profiled  the loop twice, each inside ``with swift_nb.profile():`` (report on, the
            default schedule): the first run of the process (a script's only one) and a
            later one, with the helper process warm
For each: the loop's wall time against the bare loop's of the same round (first against
first, later against later); the time to enter the ``with`` block (the first run imports
swift_nb's capture, lazily imported by ``import swift_nb``); the time from the last step
to the block's end (the results: the record, the analysis and report.html written); and
the whole process's wall time, interpreter start and imports included.

    python benchmarks/script_start.py [--steps 60] [--sample-ms 3] [--batch 8] [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

SCRIPT = """
import json, sys, tempfile, time
import torch
from torch import nn
steps, sample_ms, batch, threads, profiled = json.loads(sys.argv[1])
torch.set_num_threads(threads)
if profiled:
    import swift_nb

class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return steps * batch
    def __getitem__(self, i):
        time.sleep(sample_ms / 1000)  # reading and decoding a sample
        return torch.randn(64), torch.randint(0, 10, ())

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = torch.utils.data.DataLoader(Slow(), batch_size=batch)
out = tempfile.mkdtemp()

def loop():
    for x, y in loader:
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()

found = []
for _ in range(2):
    t = time.perf_counter()
    if profiled:
        with swift_nb.profile(out_dir=out, keep=2) as run:
            first = time.perf_counter()
            loop()
            last = time.perf_counter()
        assert run.status == "ok" and (run.path / "report.html").exists(), run.notes
    else:
        first = time.perf_counter()
        loop()
        last = time.perf_counter()
    found.append((last - first, time.perf_counter() - last, first - t))
print(json.dumps(found))
"""


def _process(args: argparse.Namespace, profiled: bool) -> tuple[float, list[list[float]]]:
    spec = json.dumps([args.steps, args.sample_ms, args.batch, args.threads, profiled])
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, spec],
        capture_output=True,
        text=True,
        check=True,
        cwd=tempfile.gettempdir(),
    )
    return time.perf_counter() - t, json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--sample-ms", type=float, default=3.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    rows = []
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {profiled: _process(args, profiled) for profiled in order}
        (bare_wall, bare), (prof_wall, prof) = got[False], got[True]
        rows.append(
            dict(
                first=prof[0][0] / bare[0][0],
                first_enter=prof[0][2],
                first_all=(prof[0][0] + prof[0][2]) / bare[0][0],
                first_exit=prof[0][1],
                later=prof[1][0] / bare[1][0],
                later_exit=prof[1][1],
                process=prof_wall / bare_wall,
                bare_loop=bare[0][0],
            )
        )

    def mid(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    print(
        f"data-bound script: {args.steps} steps of {args.batch} samples at {args.sample_ms} ms each, "
        f"torch on {args.threads} thread(s); {args.rounds} rounds of fresh processes; "
        f"bare loop {mid('bare_loop'):.2f} s (median)"
    )
    table = [
        ("first run: loop / bare loop", f"{mid('first'):.3f}", "1.10"),
        ("first run: entering the block (s)", f"{mid('first_enter'):.2f}", "-"),
        ("first run: block's entry + loop / bare", f"{mid('first_all'):.3f}", "-"),
        ("first run: last step -> results (s)", f"{mid('first_exit'):.2f}", "0.5"),
        ("later run: loop / bare loop", f"{mid('later'):.3f}", "1.05"),
        ("later run: last step -> results (s)", f"{mid('later_exit'):.2f}", "0.5"),
        ("whole process / bare process", f"{mid('process'):.3f}", "-"),
    ]
    print(f"| {'median of the rounds':<38} | {'measured':>9} | {'target':>6} |")
    print(f"|{'-' * 40}|{'-' * 11}|{'-' * 8}|")
    for label, value, goal in table:
        print(f"| {label:<38} | {value:>9} | {goal:>6} |")
    print(
        "rounds (first, first exit s, later, later exit s, process): "
        + "; ".join(
            f"{r['first']:.3f}, {r['first_exit']:.2f}, {r['later']:.3f}, {r['later_exit']:.2f}, {r['process']:.3f}"
            for r in rows
        )
    )


if __name__ == "__main__":
    main()
