"""Will it scale, measured: for each model × layout × link, the 2-rank job forecast by
``swift_nb.scale`` from the 1-process run against the job measured on this machine (CPU,
gloo, one torch thread per rank, the same per-rank batch), then the forecast table to 8
ranks on the presets.

Links: ``loopback`` (both ranks on 127.0.0.1) and, where this machine lets root make
network namespaces, ``veth`` (each rank in its own namespace, joined by a veth pair whose
rate ``tc``'s token bucket limits to ``--rate``). Each link is measured with
``swift_nb.measure_link()`` on a job's own process group over it.

    python benchmarks/scale_forecast.py [--rate 1gbit] [--links loopback,veth] [--steps 12]
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


def _pct(pred: float, meas: float) -> str:
    return f"{(pred - meas) / meas * 100:+.1f} %"


def compare(out: str, link_name: str, net: Namespaces | None, steps: int) -> list[dict]:
    link = measured_link(out, net)
    fit = link.fit("all_reduce")
    print(
        f"\n[{link_name}] measured link: all-reduce β {fit.busbw / 1e9:.3f} GB/s, α {fit.hop_s * 1e6:.0f} µs/hop; "
        + "; ".join(
            f"{p['bytes'] / 1e6:.2g} MB: busbw {p['busbw'] / 1e9:.3f} GB/s"
            for p in link.measured["points"]
            if p["kind"] == "all_reduce"
        )
    )
    rows, singles = [], {}
    for kind, layout, grad in CASES:
        if kind not in singles:
            singles[kind] = single(out, kind, steps)
        base = singles[kind]
        job_run = swift_nb.load_run(job(out, kind, layout, grad, steps, net))
        table = swift_nb.scale(
            base, (1, 2), link, layout, grad_dtype=grad if grad != "fp32" else None, measured=job_run
        )
        r = table[table["world_size"] == 2].iloc[0]
        rows.append(
            {
                "link": link_name,
                "model": kind,
                "layout": layout,
                "grads": grad,
                "1-rank step ms": base.summary["step_time_median_s"] * 1e3,
                "pred step ms": r["step_s"] * 1e3,
                "meas step ms": r["measured_step_s"] * 1e3,
                "step err": _pct(r["step_s"], r["measured_step_s"]),
                "pred comm ms": r["comm_s"] * 1e3,
                "meas comm ms": r["measured_comm_s"] * 1e3,
                "comm err": _pct(r["comm_s"], r["measured_comm_s"]),
                "pred eff": r["efficiency"],
                "meas eff": r["measured_efficiency"],
            }
        )
        print(pd.DataFrame(rows[-1:]).to_string(index=False, float_format=lambda v: f"{v:.3g}"), flush=True)
    return rows


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
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as out:
        for name in a.links.split(","):
            if name == "loopback":
                rows += compare(out, "loopback", None, a.steps)
            elif name == "veth":
                why_not = Namespaces.unavailable()
                if why_not:
                    print(f"\n[veth] not measured: {why_not}")
                    continue
                with Namespaces(a.rate) as net:
                    rows += compare(out, f"veth {a.rate}", net, a.steps)
        print("\nAll cases")
        print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        presets(single(out, "comm", a.steps))


if __name__ == "__main__":
    main()
