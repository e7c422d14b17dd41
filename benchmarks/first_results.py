"""How soon a profiled cell shows its results, in a real kernel: the cell runs an LM the
project does not ship (``never_waits.LM``, torch on ``--threads`` threads) under
``%%swift_profile`` and notes the wall time of its last step; the kernel's output messages
are stamped by the kernel as it sends them. Per round, from the last step to:
  Summary     the first output holding the Summary (and the verdict)
  figures     the first figure (image/png)
  report      report.html on disk (its modification time)
  cell end    the cell's reply
Rounds run in one kernel, the first apart (it starts the helper and imports what a first
run needs). Targets: the Summary within 0.3 s of the last step; report.html is complete
when the cell returns.

    python benchmarks/first_results.py [--steps 200] [--rounds 4] [--threads 1]
    python benchmarks/first_results.py --steps 120 --rounds 1 --flags "--active 100 --with-stack"

``--flags``: the magic's own flags, e.g. more recorded steps for a large trace (its size is
printed).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import textwrap
import time
from pathlib import Path

from jupyter_client.manager import start_new_kernel

SETUP = """
import sys, time, torch
sys.path.insert(0, {bench!r})
from never_waits import LM
torch.set_num_threads({threads})
torch.manual_seed(0)
vocab, seq = 2000, 64
model = LM(vocab, 128, 4, seq)
opt = torch.optim.AdamW(model.parameters(), 1e-3)
batches = [torch.randint(0, vocab, (8, seq)) for _ in range(4)]
%load_ext swift_nb
"""

CELL = """%%swift_profile --out {out} {flags}
for i in range({steps}):
    x = batches[i % 4]
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
    last_step = time.time()
"""


def execute(kc, code: str, timeout: float = 600) -> list[dict]:
    """Run ``code``; its iopub messages, until the kernel is idle again."""
    msg_id = kc.execute(code)
    messages = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(msg)
        if msg["msg_type"] == "error":
            raise RuntimeError("\n".join(msg["content"]["traceback"]))
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return messages
    raise TimeoutError(code)


def sent(msg: dict) -> float:
    return msg["header"]["date"].timestamp()


def first(messages: list[dict], test) -> float | None:
    for msg in messages:
        if msg["msg_type"] in ("display_data", "update_display_data") and test(msg["content"]["data"]):
            return sent(msg)
    return None


def one_round(kc, steps: int, out: Path, flags: str = "") -> dict[str, float]:
    messages = execute(kc, CELL.format(out=out, steps=steps, flags=flags))
    last = float(execute_value(kc, "print(repr(last_step))"))
    reports = sorted(out.glob("*/report.html"), key=lambda p: p.stat().st_mtime)
    return {
        "summary": first(messages, lambda d: "swift-nb-summary" in d.get("text/html", "")) - last,
        "figures": first(messages, lambda d: "image/png" in d) - last,
        "report": reports[-1].stat().st_mtime - last,
        "end": sent(messages[-1]) - last,
        "trace_mb": sum(p.stat().st_size for p in reports[-1].parent.glob("trace*.json.gz")) / 1e6,
    }


def execute_value(kc, code: str) -> str:
    for msg in execute(kc, code):
        if msg["msg_type"] == "stream":
            return msg["content"]["text"].strip()
    raise RuntimeError(f"{code} printed nothing")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=4, help="later runs, after the first")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--flags", default="", help="the magic's flags, e.g. '--active 100 --with-stack'")
    args = ap.parse_args()
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        execute(kc, textwrap.dedent(SETUP.format(bench=str(Path(__file__).parent), threads=args.threads)))
        with tempfile.TemporaryDirectory() as tmp:
            rounds = [one_round(kc, args.steps, Path(tmp), args.flags) for _ in range(args.rounds + 1)]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    keys = [("summary", "Summary (and verdict) shown", "0.3"), ("figures", "first figure shown", "–")]
    keys += [("report", "report.html written", "before the cell ends"), ("end", "cell ends", "–")]
    print(
        f"\n{args.steps} steps {args.flags}, torch on {args.threads} thread(s); the trace "
        f"{rounds[-1]['trace_mb']:.1f} MB gzipped; seconds after the last step\n"
    )
    print(f"| from the last step to | first run | later runs (median of {args.rounds}) | max | target |")
    print("|---|---|---|---|---|")
    for key, label, target in keys:
        later = [r[key] for r in rounds[1:]]
        print(
            f"| {label} | {rounds[0][key]:.3f} | {statistics.median(later):.3f} | {max(later):.3f} | {target} |"
        )


if __name__ == "__main__":
    main()
