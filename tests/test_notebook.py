"""End to end: a real notebook with %%swift_profile executed through nbclient/ipykernel."""

from __future__ import annotations

import gzip
import json
import re

import nbformat
from conftest import kernel_env
from nbclient import NotebookClient

import swift_nb

STEPS = 12
SCHEDULE = {"wait": 1, "warmup": 2, "active": 3}


def test_profiled_training_cell_produces_a_complete_run(tmp_path):
    out = tmp_path / "runs"
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext swift_nb"),
        nbformat.v4.new_code_cell(
            "import torch\n"
            "from swift_nb.demo import GPTConfig, GPT, make_loader\n"
            "torch.manual_seed(0)\n"
            "cfg = GPTConfig(seq_len=32, n_layer=2, n_head=2, d_model=64, vocab_size=256)\n"
            "model = GPT(cfg)\n"
            "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
            f"loader = make_loader(cfg, batch_size=4, n_samples=4 * {STEPS})\n"
            "param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())"
        ),
        nbformat.v4.new_code_cell(
            f"%%swift_profile --label nb --out {out}\n"
            "taken = 0\n"
            "for x, y in loader:\n"
            "    model(x, y).backward()\n"
            "    opt.step()\n"
            "    opt.zero_grad()\n"
            "    taken += 1\n"
            "print('trained', taken)"
        ),
        nbformat.v4.new_code_cell("print(taken, param_bytes)"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute(env=kernel_env())

    taken, param_bytes = map(int, nb.cells[3].outputs[0]["text"].split())
    assert taken == STEPS
    profiled = nb.cells[2].outputs
    assert any(o.get("name") == "stdout" and f"trained {STEPS}" in o["text"] for o in profiled)
    mimes = {m for o in profiled for m in o.get("data", {})}
    assert {"image/png", "text/html"} <= mimes
    html = "".join(o.get("data", {}).get("text/html", "") for o in profiled)
    for section in ("Verdict", "Findings", "Step time breakdown", "Memory by category", "Top operators"):
        assert section in html, section
    assert sum("image/png" in o.get("data", {}) for o in profiled) >= 4  # timeline, breakdown, memory, ops
    assert not any("USDT" in o.get("text", "") for o in profiled), "profiler noise reached the cell"

    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    for name in ("run.json", "steps.csv", "samples.csv", "memory.csv", "trace.json.gz", "report.html"):
        assert (folder / name).is_file(), name
    run = swift_nb.load_run(folder)
    assert run.status == "ok"
    assert run.summary["steps"] == STEPS == len(run.steps)
    assert list(run.steps["step"]) == list(range(STEPS))
    assert run.samples["step"].notna().all()
    assert run.summary["peak_mem_bytes"] >= param_bytes

    with gzip.open(folder / "trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    recorded = sorted(
        int(m.group(1)) for e in events if (m := re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", "")))
    )
    first_active = SCHEDULE["wait"] + SCHEDULE["warmup"]
    assert recorded == list(range(first_active, first_active + SCHEDULE["active"]))
    assert list(run.steps.loc[run.steps["phase"] == "active", "step"]) == recorded
