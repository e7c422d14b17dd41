"""What durability costs, and what a SIGKILL loses.

1. Cost of the journal (steps, samples and notes appended to the run folder every
   second while the run runs) on the demo model's loop: the journal's own time per
   second and per step, and the step time with the journal on (1 s) and off (an
   interval longer than the run), interleaved round by round.
2. Loss window under SIGKILL: a profiled loop is killed at a random point, N times; the
   loss is the time from the last step the record holds to the kill (every step after it
   is lost). Target: at most 1 s.

    python benchmarks/durability.py [--steps 60] [--rounds 3] [--kills 20]
"""

from __future__ import annotations

import argparse
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

import swift_nb
from swift_nb.capture import journal
from swift_nb.demo import GPT, GPTConfig

KILLED_LOOP = textwrap.dedent(
    """
    import sys, time, torch, swift_nb
    m = torch.nn.Linear(64, 64); o = torch.optim.SGD(m.parameters(), lr=0.1)
    with swift_nb.profile(out_dir=sys.argv[1], wait=0, warmup=1, active=2, report=False):
        for i in range(10**9):
            m(torch.randn(8, 64)).sum().backward(); o.step(); o.zero_grad()
            print(i + 1, time.time(), flush=True)
            time.sleep(0.01)
    """
)


def cost(args) -> None:
    torch.manual_seed(0)
    cfg = GPTConfig(
        seq_len=args.seq, n_layer=args.layers, d_model=args.width, n_head=max(1, args.width // 64)
    )
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = [(torch.randint(0, cfg.vocab_size, (args.batch, cfg.seq_len)),) * 2 for _ in range(args.steps)]
    out = tempfile.mkdtemp(prefix="swift_nb_bench_")
    results: dict[str, list[float]] = {"journal off": [], "journal 1 s": []}
    flush_s, flushes, wall = [], [], []
    for _ in range(args.rounds):
        for mode in results:
            journal.FLUSH_INTERVAL_S = 1.0 if mode == "journal 1 s" else 1e6
            with swift_nb.profile(out_dir=out, report=False, keep=100) as run:
                for x, y in batches:
                    model(x, y).backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            results[mode].append(float(run.steps["duration_s"].median()))
            if mode == "journal 1 s":
                flush_s.append(run.summary["journal_s"])
                flushes.append(run.summary["journal_flushes"])
                wall.append(run.wall_s)
    journal.FLUSH_INTERVAL_S = 1.0
    off, on = statistics.median(results["journal off"]), statistics.median(results["journal 1 s"])
    per_flush = sum(flush_s) / max(1, sum(flushes))
    per_s = sum(flush_s) / sum(wall)
    print(
        f"demo model: seq {args.seq}, {args.layers} layers, width {args.width}, batch {args.batch}; "
        f"{args.steps} steps × {args.rounds} rounds"
    )
    print(f"{'median step, journal off':<34} {off * 1e3:8.2f} ms")
    print(f"{'median step, journal every 1 s':<34} {on * 1e3:8.2f} ms   ({(on / off - 1) * 100:+.2f} %)")
    print(
        f"{'journal time per flush':<34} {per_flush * 1e3:8.3f} ms   ({statistics.median(flushes):.0f} flushes a run)"
    )
    print(f"{'journal time per second of run':<34} {per_s * 1e3:8.3f} ms   ({per_s * 100:.3f} % of the run)")
    print(
        f"{'journal time per step':<34} {sum(flush_s) / (args.steps * args.rounds) * 1e3:8.3f} ms   "
        f"({sum(flush_s) / (args.steps * args.rounds) / on * 100:.3f} % of a step)"
    )


def kills(n: int) -> None:
    rng = random.Random(0)
    losses = []
    for _ in range(n):
        with tempfile.TemporaryDirectory(prefix="swift_nb_kill_") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", KILLED_LOOP, out], stdout=subprocess.PIPE, text=True
            )
            assert proc.stdout is not None
            printed: dict[int, float] = {}
            proc.stdout.readline()  # the first step: the run has started
            deadline = time.time() + rng.uniform(1.0, 4.0)
            for line in proc.stdout:
                k, t = line.split()
                printed[int(k)] = float(t)
                if time.time() >= deadline:
                    break
            killed_at = time.time()
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            run = swift_nb.load_run(Path(swift_nb.runs(out).path[0]))
            kept = len(run.steps)  # steps 0 … kept-1; step k-1 printed "k" when it ended
            last_kept = printed.get(kept, min(printed.values()) if printed else killed_at)
            losses.append(killed_at - last_kept)
            assert run.status == "crashed", run.status
    print(f"SIGKILL at a random point, {n} times: loss window (last step kept → kill)")
    print(
        f"  median {statistics.median(losses):.3f} s, max {max(losses):.3f} s "
        f"(target ≤ 1 s; journal interval {journal.FLUSH_INTERVAL_S:g} s)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--kills", type=int, default=20)
    args = ap.parse_args()
    cost(args)
    kills(args.kills)


if __name__ == "__main__":
    main()
