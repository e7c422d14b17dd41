"""A profiled training loop that runs until a signal ends it (for the durability tests).

Prints ``step N`` after each optimizer step (flushed), so the parent knows how far it got.
``--handler`` installs the user's own SIGTERM handler first (it prints and exits 7).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

import torch

import swift_nb

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--handler", action="store_true")
p.add_argument("--sleep", type=float, default=0.05)
p.add_argument("--steps", type=int, default=100_000)
args = p.parse_args()

if args.handler:

    def on_term(signum, frame):
        print("user handler ran", flush=True)
        sys.exit(7)

    signal.signal(signal.SIGTERM, on_term)

torch.manual_seed(0)
model = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with swift_nb.profile(out_dir=args.out, wait=0, warmup=1, active=2, interval_ms=50, label="durable"):
    for i in range(args.steps):
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
        print(f"step {i + 1} {time.time():.3f}", flush=True)
        time.sleep(args.sleep)
print("finished", flush=True)
