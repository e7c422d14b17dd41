"""Overhead of an isolated rerun over the bare cell: worker start, imports, replay of the
setup cells, the profiled cell, its analysis and report, and the clean-up.

Times, over several rounds: the cell alone in this process (bare), and a whole rerun
(``run_variants`` with no variant: the baseline rerun only) of the same setup + cell.
overhead = rerun − bare setup − bare cell.

``--compare flash_attention,grad_checkpointing`` times instead a comparison (the baseline
and those variants) with workers forked from the session's warm server and with fresh
worker processes (``SWIFT_NB_RERUN_FORK=0``): each worker's wall time from its start to
its result, the session's first comparison apart from the later ones.

    python benchmarks/rerun.py [--rounds 3] [--steps 10] [--compare A,B]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from swift_nb.rerun import forkserver, parse_variants, run_variants

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


def compare(rounds: int, steps: int, variants: str) -> None:
    """Each worker's wall time in ``rounds`` comparisons, forked and fresh."""
    table = []
    with tempfile.TemporaryDirectory() as root:
        for mode in ("forked", "fresh"):
            os.environ[forkserver.FORK_ENV] = "1" if mode == "forked" else "0"
            if forkserver._server is not None:  # a new session: no warm server yet
                forkserver._server.close()
                forkserver._server = None
            for i in range(rounds):
                t = time.perf_counter()
                outcomes = run_variants(
                    [SETUP],
                    CELL.format(steps=steps),
                    "--wait 0 --warmup 1 --active 2",
                    parse_variants(variants),
                    Path(root) / f"{mode}{i}",
                )
                total = time.perf_counter() - t
                assert all(o.status == "ok" for o in outcomes), outcomes
                walls = [o.wall_s for o in outcomes]
                table.append((mode, i, walls, total))
                print(
                    f"{mode} round {i}: " + ", ".join(f"{o.variant} {o.wall_s:.2f} s" for o in outcomes),
                    flush=True,
                )
    print(f"\n{'workers':>8} {'round':>6} {'baseline':>9} {'variants (median)':>18} {'comparison':>11}")
    for mode, i, walls, total in table:
        print(f"{mode:>8} {i:>6} {walls[0]:>9.2f} {statistics.median(walls[1:]):>18.2f} {total:>11.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--compare", help="variants: time a comparison, forked and fresh")
    args = ap.parse_args()
    if args.compare:
        compare(args.rounds, args.steps, args.compare)
        return
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
