"""Compile time of ``regional_compile`` (each repeated block compiled, one code for all)
against whole-model ``torch_compile`` (Inductor, CPU), on the demo GPT with 4 blocks, and
the losses of 3 steps against eager. Each variant runs in a fresh process (dynamo's caches
are per process). Columns: compile_s as swift_nb records it (``summary["compile_s"]``), the
first step's wall time, the ratio to whole-model compile, and whether the 3 losses match
eager's (rel 1e-5).

    python benchmarks/regional_compile.py [--layers 4] [--width 128]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

CHILD = r"""
import contextlib, io, json, sys, time, torch, swift_nb
from swift_nb.demo import make_model
toggle, layers, width, root = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.manual_seed(0)
model = make_model(n_layer=layers, n_head=4, d_model=width, vocab_size=512, seq_len=128)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randint(0, 512, (4, 128))
losses, first = [], None
with contextlib.redirect_stdout(io.StringIO()):
    with swift_nb.profile(out_dir=root, wait=0, warmup=1, active=1, report=False,
                          toggles=[toggle] if toggle != "eager" else []) as run:
        for i in range(3):
            t = time.perf_counter()
            loss = model(x, x); loss.backward(); opt.step(); opt.zero_grad()
            losses.append(loss.item())
            first = first or time.perf_counter() - t
print(json.dumps({"losses": losses, "first_s": first,
                  "compile_s": swift_nb.load_run(run.path).summary.get("compile_s", 0.0)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="swift_nb_regional_")
    out = {}
    for toggle in ("eager", "torch_compile", "regional_compile"):
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, toggle, str(args.layers), str(args.width), root],
            capture_output=True,
            text=True,
            check=True,
        )
        out[toggle] = json.loads(proc.stdout.strip().splitlines()[-1])
    whole = out["torch_compile"]["compile_s"]
    print("variant | compile_s | first step | ×whole compile | losses = eager")
    print("--- | --- | --- | --- | ---")
    for toggle, r in out.items():
        same = all(
            abs(a - b) <= 1e-5 * abs(b) for a, b in zip(r["losses"], out["eager"]["losses"], strict=True)
        )
        ratio = f"{r['compile_s'] / whole:.2f}" if whole and toggle != "eager" else ""
        print(
            f"{toggle} | {r['compile_s']:.2f} s | {r['first_s']:.2f} s | {ratio} | {'yes' if same else 'NO'}"
        )


if __name__ == "__main__":
    main()
