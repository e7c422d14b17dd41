"""The one profiled run of the demo GPT that the tests whose sizes don't matter share
(``demo_gpt`` in tests/conftest.py, once per test process): its shape, and the user strings
it carries to check that reports escape them."""

from __future__ import annotations

from pathlib import Path

import torch

import swift_nb
from swift_nb.demo import make_model
from swift_nb.record import Run

N_LAYER, D_MODEL, N_HEAD, VOCAB = 2, 96, 2, 256
SEQ, BATCH = 24, 3
#: profiler steps recorded (after one warmup step); the loop runs two more
ACTIVE = 2
#: a label and a context value a report must escape
EVIL_LABEL = "<script>alert(1)</script>"
EVIL_OP = "<img src=x onerror=alert(1)>"


def profile_demo_gpt(out_dir: Path) -> Run:
    """``ACTIVE + 2`` optimizer steps of the demo GPT, ``ACTIVE`` recorded by the profiler."""
    torch.manual_seed(0)
    model = make_model(seq_len=SEQ, n_layer=N_LAYER, d_model=D_MODEL, n_head=N_HEAD, vocab_size=VOCAB)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, VOCAB, (BATCH, SEQ))
    with swift_nb.profile(
        out_dir=out_dir, wait=0, warmup=1, active=ACTIVE, label=EVIL_LABEL, context={"note": EVIL_OP}
    ) as run:
        for _ in range(ACTIVE + 2):
            model(x, x).backward()
            opt.step()
            opt.zero_grad()
    assert run.status == "ok" and run.trace_path is not None
    return run
