"""Sequence-parallel reruns of the demo GPT: per-rank peak memory and step time for
P = 1 (the baseline rerun), 2 and 4 ranks, Ulysses and Ring, at several sequence lengths.

Every number comes from the job records the reruns write (swift_nb's own memory
analysis): ``peak`` is the largest per-rank peak tensor bytes of a recorded step
(``analysis.ranks.per_rank``), ``act`` rank 0's largest activation bytes over its recorded steps
(``memory_footprint``: activations are alike on every rank), ``step`` the
slowest rank's median step time, ``comm`` the largest share of a step spent in
collectives. Ring variants use ``ring_chunk_size`` (tokens per score tile).

    python benchmarks/sequence_parallel.py [--seq 2048 4096] [--ranks 2 4] [--steps 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import pandas as pd

import swift_nb
from swift_nb.analysis.memory import memory_footprint
from swift_nb.analysis.ranks import per_rank
from swift_nb.core.units import fmt_bytes
from swift_nb.rerun import parse_variants, run_variants

SETUP = (
    "import torch\n"
    "from swift_nb.demo import make_model\n"
    "torch.manual_seed(0)\n"
    "model = make_model(n_layer={layers}, n_head=4, d_model={d_model}, seq_len={seq}, vocab_size=1024)\n"
    "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
)
CELL = (
    "for _ in range({steps}):\n"
    "    idx = torch.randint(0, 1024, (1, {seq}))\n"
    "    model(idx, idx).backward()\n"
    "    opt.step(); opt.zero_grad()\n"
)


def measure(seq: int, ranks: list[int], steps: int, layers: int, d_model: int, chunk: int) -> pd.DataFrame:
    spec = ",".join(
        f"sequence_parallel(sp_size={p},sp_mode=ulysses),"
        f"sequence_parallel(sp_size={p},sp_mode=ring,ring_chunk_size={chunk})"
        for p in ranks
    )
    with tempfile.TemporaryDirectory() as tmp:
        outcomes = run_variants(
            [SETUP.format(seq=seq, layers=layers, d_model=d_model)],
            CELL.format(seq=seq, steps=steps),
            f"--wait 1 --warmup 0 --active {steps - 1}",
            parse_variants(spec),
            Path(tmp),
            timeout_s=1800,
        )
        rows = []
        for o in outcomes:
            row = {"seq": seq, "variant": o.variant, "status": o.status}
            if o.run_path:
                run = swift_nb.load_run(o.run_path)
                pr = per_rank(run)
                fp = memory_footprint(run).set_index("category")["max_bytes"]
                row.update(
                    ranks=len(pr),
                    peak_bytes=pr["peak_mem_bytes"].max(),
                    act_bytes=fp.get("activations"),
                    step_s=pr["step_time_median_s"].max(),
                    comm=pr["collective_share"].max(),
                )
            else:
                row["error"] = (o.error or "").strip().splitlines()[-1:]
            rows.append(row)
    df = pd.DataFrame(rows)
    base = df.iloc[0]
    df["peak_ratio"] = df["peak_bytes"] / base["peak_bytes"]
    df["act_ratio"] = df["act_bytes"] / base["act_bytes"]
    return df


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[2048, 4096])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=3, help="steps per run; all but the first are recorded")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=512, help="ring_chunk_size of the Ring variants")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    table = pd.concat(
        [measure(s, args.ranks, args.steps, args.layers, args.d_model, args.chunk) for s in args.seq]
    )
    shown = table.assign(
        peak=table["peak_bytes"].map(lambda v: fmt_bytes(v) if pd.notna(v) else "–"),
        act=table["act_bytes"].map(lambda v: fmt_bytes(v) if pd.notna(v) else "–"),
        step=table["step_s"].map(lambda v: f"{v:.2f} s" if pd.notna(v) else "–"),
        comm=table["comm"].map(lambda v: f"{100 * v:.0f} %" if pd.notna(v) else "–"),
        peak_ratio=table["peak_ratio"].map(lambda v: f"{v:.2f}×" if pd.notna(v) else "–"),
        act_ratio=table["act_ratio"].map(lambda v: f"{v:.2f}×" if pd.notna(v) else "–"),
    )
    cols = ["seq", "variant", "status", "ranks", "peak", "peak_ratio", "act", "act_ratio", "step", "comm"]
    print(shown[cols].to_string(index=False))


if __name__ == "__main__":
    main()
