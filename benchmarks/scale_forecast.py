"""Will it scale, measured: for each model × layout × link, the 2-rank job forecast by
``swift_nb.scale`` from the 1-process run against the job measured on this machine (CPU,
gloo, one torch thread per rank, the same per-rank batch), then the forecast table to 8
ranks on the presets.

Links: ``loopback`` (both ranks on 127.0.0.1) and, where this machine lets root make
network namespaces, ``veth`` (each rank in its own namespace, joined by a veth pair whose
rate ``tc``'s token bucket limits to ``--rate``). Each link is measured with
``swift_nb.measure_link()`` on a job's own process group over it.

    python benchmarks/scale_forecast.py [--rate 1gbit] [--links loopback,veth] [--steps 16] [--rounds 3]

Each round measures the link, then each case's one-process run and its 2-rank job back to
back; the table gives the medians over the rounds and the range of the step's error (this
machine's speed drifts by tens of percent between minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

import swift_nb

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "tests" / "workloads" / "scale_train.py"
sys.path.insert(0, str(ROOT / "tests" / "workloads"))

from netns_link import Namespaces, free_port  # noqa: E402

CASES = [
    ("compute", "ddp", "fp32"),
    ("comm", "ddp", "fp32"),
    ("comm", "ddp", "bf16"),
    ("comm", "fsdp", "fp32"),
]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def single(out: str, kind: str, steps: int) -> swift_nb.Run:
    cmd = [sys.executable, str(WORKLOAD), out, "1", "0", kind, "single", "fp32", str(steps)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), check=True)
    return swift_nb.load_run(done.stdout.strip().splitlines()[-1])


def job(out: str, kind: str, layout: str, grad: str, steps: int, net: Namespaces | None) -> str:
    """Rank 0's printed line (a record's folder, or link.json) of a 2-rank job."""
    args = [out, "2", str(free_port()), kind, layout, grad, str(steps)]
    if net is None:
        done = subprocess.run(
            [sys.executable, str(WORKLOAD), *args], capture_output=True, text=True, env=_env()
        )
        if done.returncode:
            raise RuntimeError(done.stderr[-3000:])
        return done.stdout.strip().splitlines()[-1]
    return net.run_ranks([sys.executable, str(WORKLOAD), *args], _env())


def measured_link(out: str, net: Namespaces | None) -> swift_nb.Link:
    path = job(out, "comm", "link", "fp32", 1, net)
    return swift_nb.Link.from_dict(json.loads(Path(path).read_text()))


def one_round(out: str, link_name: str, net: Namespaces | None, steps: int, r: int) -> list[dict]:
    """Every case once: the link measured, then per case its 1-process run and its job,
    back to back (the machine's speed drifts between minutes: pairs, not batches)."""
    link = measured_link(out, net)
    fit = link.fit("all_reduce")
    # nccl-tests' bus bandwidth of the largest all-reduce, from the same timings
    big = max((p for p in link.measured["points"] if p["kind"] == "all_reduce"), key=lambda p: p["bytes"])
    print(
        f"[{link_name}] round {r}: all-reduce β {fit.busbw / 1e9:.3f} GB/s "
        f"(busbw of the {big['bytes'] / 1e6:.0f} MB all-reduce {big['busbw'] / 1e9:.3f} GB/s, "
        f"{fit.busbw / big['busbw'] - 1:+.1%}), α {fit.hop_s * 1e6:.0f} µs/hop, "
        f"compute runs under {link.overlap:.0%} of an all-reduce",
        flush=True,
    )
    rows = []
    for kind, layout, grad in CASES:
        base = single(out, kind, steps)
        job_run = swift_nb.load_run(job(out, kind, layout, grad, steps, net))
        g = grad if grad != "fp32" else None
        t = swift_nb.scale(base, (1, 2), link, layout, grad_dtype=g, measured=job_run)
        row = t[t["world_size"] == 2].iloc[0]
        rows.append(
            {
                "link": link_name,
                "round": r,
                "model": kind,
                "layout": layout,
                "grads": grad,
                "one_s": base.summary["step_time_median_s"],
                "pred_s": row["step_s"],
                "meas_s": row["measured_step_s"],
                "pred_comm_s": row["comm_s"],
                "meas_comm_s": row["measured_comm_s"],
                "pred_added_s": row["step_s"] - base.summary["step_time_median_s"],
                "meas_added_s": row["measured_step_s"] - base.summary["step_time_median_s"],
                "pred_eff": row["efficiency"],
                "meas_eff": row["measured_efficiency"],
            }
        )
    return rows


def summary(rows: list[dict]) -> pd.DataFrame:
    """Per link and case: medians over the rounds, and the step error's range."""
    df = pd.DataFrame(rows)
    df["step_err_pct"] = 100 * (df["pred_s"] / df["meas_s"] - 1)
    keys = ["link", "model", "layout", "grads"]
    g = df.groupby(keys, sort=False)
    out = g[["one_s", "pred_s", "meas_s", "pred_added_s", "meas_added_s", "pred_eff", "meas_eff"]].median()
    out["step_err_pct (median)"] = g["step_err_pct"].median()
    out["step_err_pct (min..max)"] = g["step_err_pct"].agg(lambda e: f"{e.min():+.1f}..{e.max():+.1f}")
    out["rounds"] = g.size()
    for c in ("one_s", "pred_s", "meas_s", "pred_added_s", "meas_added_s"):
        out[c.replace("_s", "_ms")] = out.pop(c) * 1e3
    return out.reset_index()


def presets(base: swift_nb.Run) -> None:
    for name in ("nvlink4", "pcie4", "ib-ndr"):
        t = swift_nb.scale(base, (1, 2, 4, 8), name)
        print(f"\n[{name}] the comm-bound model's CPU step, its collectives at {name}'s bus bandwidth")
        cols = ["world_size", "layout", "comm_s", "exposed_comm_s", "step_s", "efficiency", "why"]
        print(t[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--links", default="loopback,veth")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as out:
        for name in a.links.split(","):
            if name == "loopback":
                for r in range(a.rounds):
                    rows += one_round(out, "loopback", None, a.steps, r)
            elif name == "veth":
                why_not = Namespaces.unavailable()
                if why_not:
                    print(f"\n[veth] not measured: {why_not}")
                    continue
                with Namespaces(a.rate) as net:
                    for r in range(a.rounds):
                        rows += one_round(out, f"veth {a.rate}", net, a.steps, r)
        pd.set_option("display.width", 250)
        print("\nEvery round")
        print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print("\nPer case, the 2-rank job against its forecast (medians over the rounds)")
        print(summary(rows).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        presets(single(out, "comm", a.steps))


if __name__ == "__main__":
    main()
