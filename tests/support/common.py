"""What tests of every tier share: tiny training loops, a free port for a process group's
store, the quickstart's steps, and a real IPython kernel driven like a notebook frontend."""

from __future__ import annotations

import os
import queue
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from jupyter_client.manager import KernelManager

#: what a test's ranks import before they are forked (``rank_context``)
RANK_PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "swift_nb", "swift_nb.api"]


def rank_context():
    """multiprocessing's context for a test's ranks: forked from a server process that has
    imported torch and swift_nb once (``RANK_PRELOAD``), not spawned (each fresh interpreter
    pays 5 s of imports), and never forked from the test process itself (its threads)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(RANK_PRELOAD)
    return ctx


def train(steps: int, model: torch.nn.Module | None = None, opt=None, batch: int = 4) -> torch.nn.Module:
    """A few real optimizer steps on a small MLP."""
    torch.manual_seed(0)
    model = model or torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = opt or torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        x = torch.randn(batch, 32)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model


QUICKSTART = Path(__file__).resolve().parents[2] / "notebooks" / "01_quickstart.ipynb"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a process group's store)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quickstart_steps() -> int:
    """The steps the quickstart's profiled cell runs: its ``--steps`` hint, read from the
    notebook itself so that tests never keep a second copy of it."""
    import json
    import re

    for cell in json.loads(QUICKSTART.read_text())["cells"]:
        m = re.search(r"%%swift_profile[^\n]*--steps (\d+)", "".join(cell["source"]))
        if m:
            return int(m.group(1))
    raise AssertionError(f"no %%swift_profile --steps N in {QUICKSTART}")


def kernel_env() -> dict[str, str]:
    """The kernel's environment: ipykernel stops forwarding fd 1/2 output (C-level prints,
    torch's warnings) when it sees PYTEST_CURRENT_TEST, unlike in a real notebook."""
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}


@dataclass
class CellResult:
    status: str
    outputs: list[dict] = field(default_factory=list)

    def text(self, name: str | None = None) -> str:
        """Concatenated stream text (``name`` = stdout/stderr) and text/plain outputs."""
        parts = []
        for o in self.outputs:
            if o["msg_type"] == "stream" and (name is None or o["content"]["name"] == name):
                parts.append(o["content"]["text"])
            elif name is None and "data" in o["content"]:
                parts.append(o["content"]["data"].get("text/plain", ""))
        return "".join(parts)

    def of_type(self, msg_type: str) -> list[dict]:
        return [o["content"] for o in self.outputs if o["msg_type"] == msg_type]

    def mimetypes(self) -> set[str]:
        return {m for o in self.outputs for m in o["content"].get("data", {})}


class Kernel:
    """A real ipykernel, driven like a notebook frontend."""

    def __init__(self, cwd: Path) -> None:
        self.km = KernelManager()
        self.km.kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        self.km.start_kernel(cwd=str(cwd), env=kernel_env())
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def execute(self, code: str, timeout: float = 300, on_output=None) -> CellResult:
        msg_id = self.kc.execute(code)
        result = CellResult(status="?")
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"cell did not finish within {timeout}s:\n{code}") from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            if kind == "status" and msg["content"]["execution_state"] == "idle":
                break
            if kind in ("stream", "display_data", "update_display_data", "execute_result", "error"):
                result.outputs.append(msg)
                if on_output is not None:
                    on_output(msg)
        while True:
            reply = self.kc.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                result.status = reply["content"]["status"]
                return result

    def eval(self, expr: str):
        """Evaluate ``expr`` in the kernel and return its repr parsed back as a literal."""
        import ast

        res = self.execute(f"print(repr({expr}))")
        assert res.status == "ok", res.outputs
        return ast.literal_eval(res.text("stdout").strip())

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
