"""A training loop that runs out of memory under a real limit (RLIMIT_AS): three steps fit,
then a batch 24× larger does not. Run as ``python oom_job.py OUT_DIR ACTIVE [BATCH]``:
the profiler records steps 1..ACTIVE (so with ACTIVE=2 the failing step 3 is outside
its window). Prints the run's status and folder on its last line."""

import resource
import sys

import pandas as pd
import psutil
import torch

import swift_nb
from swift_nb import demo

out_dir, active = sys.argv[1], int(sys.argv[2])
grow = int(sys.argv[3]) if len(sys.argv) > 3 else 24  # the large batch
torch.manual_seed(0)
cfg = demo.quickstart_config()
model = demo.GPT(cfg)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
tokens = torch.randint(0, cfg.vocab_size, (grow, cfg.seq_len + 1))

# pandas loads pyarrow (where installed) at its first column of strings, which maps ~1 GiB of
# address space (its allocator's reservations): the run's tables make one, so it comes first.
pd.Series(["a"])
# The limit: what the process maps now plus 2.5 GiB, enough for the small steps only.
limit = psutil.Process().memory_info().vms + (2500 << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
print("limit", limit, flush=True)

run = None
try:
    with swift_nb.profile(out_dir=out_dir, wait=0, warmup=1, active=active, profile_memory=True) as run:
        for step in range(6):
            batch = tokens[:1] if step < 3 else tokens  # step 3: a batch far too large
            x, y = batch[:, :-1], batch[:, 1:]
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
except RuntimeError as e:
    print("raised", type(e).__name__, str(e)[:80], flush=True)
print("RESULT", run.status if run is not None else None, run.path if run is not None else None, flush=True)
