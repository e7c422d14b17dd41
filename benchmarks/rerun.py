"""Overhead of an isolated rerun over the bare cell: worker start, imports, replay of the
setup cells, the profiled cell, its analysis and report, and the clean-up.

Times, over several rounds: the cell alone in this process (bare), and a whole rerun
(``run_variants`` with no variant: the baseline rerun only) of the same setup + cell.
overhead = rerun − bare setup − bare cell.

    python benchmarks/rerun.py [--rounds 3] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from swift_nb.rerun import run_variants

SETUP = (
    "import torch\n"
    "from swift_nb.demo import make_model\n"
    "torch.manual_seed(0)\n"
    "model = make_model(n_layer=2, n_head=4, d_model=128, seq_len=128, vocab_size=512)\n"
    "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
)
CELL = (
    "for _ in range({steps}):\n"
    "    idx = torch.randint(0, 512, (4, 128))\n"
    "    model(idx, idx).backward()\n"
    "    opt.step(); opt.zero_grad()\n"
)


def bare(steps: int) -> tuple[float, float]:
    ns: dict = {}
    t0 = time.perf_counter()
    exec(SETUP, ns)
    t1 = time.perf_counter()
    exec(CELL.format(steps=steps), ns)
    return t1 - t0, time.perf_counter() - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for i in range(args.rounds):
            setup_s, cell_s = bare(args.steps)
            t = time.perf_counter()
            (outcome,) = run_variants(
                [SETUP],
                CELL.format(steps=args.steps),
                "--wait 0 --warmup 1 --active 2",
                [],
                Path(root) / str(i),
            )
            rerun_s = time.perf_counter() - t
            assert outcome.status == "ok", outcome
            rows.append((setup_s, cell_s, rerun_s, rerun_s - setup_s - cell_s))
            print(
                f"round {i}: bare setup {setup_s:.2f} s, bare cell {cell_s:.2f} s, rerun {rerun_s:.2f} s, "
                f"overhead {rows[-1][3]:.2f} s",
                flush=True,
            )
    med = [statistics.median(c) for c in zip(*rows, strict=True)]
    print(f"\n{'':>8} {'setup':>7} {'cell':>7} {'rerun':>7} {'overhead':>9}")
    print(f"{'median':>8} {med[0]:>7.2f} {med[1]:>7.2f} {med[2]:>7.2f} {med[3]:>9.2f}")


if __name__ == "__main__":
    main()
