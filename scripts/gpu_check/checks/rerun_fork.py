"""The ``rerun_fork`` check; ``check``'s docstring says what it runs and tests."""

from __future__ import annotations

import json
from pathlib import Path

from ..common import Ctx

TITLE = "reruns forked from the warm server train on the device, with the losses of a fresh worker"

SETUP = (
    "import torch\n"
    "from swift_nb.demo import make_model\n"
    "torch.manual_seed(0)\n"
    "model = make_model(n_layer=2, n_head=4, d_model=128, seq_len=128, vocab_size=512).to({device!r})\n"
    "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
)
#: the cell notes, per worker, its process's name, its device and its losses
CELL = (
    "import json, os\n"
    "g = torch.Generator().manual_seed(1)\n"
    "losses = []\n"
    "for _ in range(6):\n"
    "    idx = torch.randint(0, 512, (4, 128), generator=g).to({device!r})\n"
    "    loss = model(idx, idx)\n"
    "    loss.backward()\n"
    "    opt.step(); opt.zero_grad()\n"
    "    losses.append(loss.item())\n"
    "with open({notes!r}, 'a') as f:\n"
    "    f.write(json.dumps({{'comm': open('/proc/self/comm').read().strip(),"
    " 'device': str(next(model.parameters()).device), 'losses': losses}}) + '\\n')\n"
)


def check(ctx: Ctx) -> None:
    """A comparison (baseline and ``flash_attention``) of the demo GPT on the device, from a
    session that has imported transformers: the workers are forked from the session's warm
    server, which never loaded the CUDA driver, and train on the device; then the same
    baseline in a fresh worker (``SWIFT_NB_RERUN_FORK=0``) has the forked baseline's losses
    (to 1e-4: the embedding's backward adds with atomics on CUDA)."""
    import os

    import transformers  # noqa: F401  (a session that trains a Hugging Face model has it)

    from swift_nb.rerun import forkserver, parse_variants, run_variants

    notes = ctx.runs / "workers.jsonl"
    ctx.runs.mkdir(parents=True, exist_ok=True)
    device = str(ctx.device)
    setup, cell = SETUP.format(device=device), CELL.format(device=device, notes=str(notes))
    flags = "--wait 0 --warmup 1 --active 2"
    forked = run_variants([setup], cell, flags, parse_variants("flash_attention"), ctx.runs / "forked")
    server = forkserver._server
    maps = Path(f"/proc/{server.proc.pid}/maps") if server is not None and server.alive() else None
    os.environ[forkserver.FORK_ENV] = "0"
    try:
        (fresh,) = run_variants([setup], cell, flags, [], ctx.runs / "fresh")
    finally:
        os.environ.pop(forkserver.FORK_ENV)
    workers = [json.loads(line) for line in notes.read_text().splitlines()] if notes.exists() else []
    ctx.details.update(
        outcomes=[
            {"variant": o.variant, "status": o.status, "wall_s": o.wall_s, "error": o.error}
            for o in [*forked, fresh]
        ],
        server_why_not=server.why_not if server is not None else "no server",
        workers=workers,
    )
    ctx.expect("the fork server was ready", server is not None and server.why_not is None)
    ctx.expect(
        "the server never loaded the CUDA driver",
        maps is not None and not forkserver.cuda_driver_loaded(maps.read_text()),
    )
    ctx.expect("every rerun ended ok", all(o.status == "ok" for o in [*forked, fresh]))
    ctx.expect(
        "the baseline and the variant ran forked, the last one fresh",
        [w["comm"] == forkserver.WORKER_NAME for w in workers] == [True, True, False],
    )
    ctx.expect(
        f"every worker trained on {ctx.device.type}",
        len(workers) == 3 and all(w["device"].startswith(ctx.device.type) for w in workers),
    )
    ctx.expect(
        "the fresh baseline's losses are the forked baseline's (1e-4 relative: atomics)",
        len(workers) == 3
        and len(workers[0]["losses"]) == len(workers[2]["losses"]) > 0
        and all(
            abs(a - b) <= 1e-4 * abs(b)
            for a, b in zip(workers[0]["losses"], workers[2]["losses"], strict=True)
        ),
    )
