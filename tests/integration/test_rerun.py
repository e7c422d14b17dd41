"""Isolated reruns and comparisons with real worker processes (and a real kernel for the
session replay): the kernel's objects stay untouched, faults are reported per variant,
nothing is left running."""

from __future__ import annotations

import shlex
import shutil
import threading
import time
from pathlib import Path

import psutil
import pytest

import swift_nb
from swift_nb.core.errors import ConfigError
from swift_nb.rerun import RerunBusyError, launcher, parse_variants, run_variants
from swift_nb.rerun.forkserver import WORKER_NAME
from swift_nb.rerun.history import prepare
from swift_nb.rerun.launcher import Worker
from swift_nb.vocabulary.options import ProfileOptions

SETUP = (
    "import torch\n"
    "from swift_nb.demo import make_model\n"
    "torch.manual_seed(0)\n"
    "model = make_model(n_layer=2, n_head=4, d_model=64, seq_len=64, vocab_size=128, attn_impl='eager')\n"
)
OPT = "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
TRAIN = (
    "for _ in range(5):\n"
    "    idx = torch.randint(0, 128, (2, 64))\n"
    "    model(idx, idx).backward()\n"
    "    opt.step(); opt.zero_grad()\n"
)
FLAGS = "--wait 0 --warmup 1 --active 2"


def test_parse_variants_and_worker_flags():
    vs = parse_variants("flash_attention, grad_checkpointing+galore(rank=64,gap=200)")
    assert [v.name for v in vs] == ["flash_attention", "grad_checkpointing+galore(rank=64,gap=200)"]
    assert vs[1].toggles[1].values["rank"] == 64 and vs[1].toggles[1].values["update_proj_gap"] == 200
    with pytest.raises(ConfigError, match="galore rank must be ≥ 1"):
        parse_variants("galore(rank=0)")
    with pytest.raises(ConfigError, match="unbalanced parentheses"):
        parse_variants("galore(rank=4")
    line = "--wait 0 --compare a,b --galore rank=4 --flash-attn --active 2 --out '/x y' --label z --flops"
    worker = Worker([], "pass", line, Path("/tmp/runs"), vs[1])
    magic = shlex.split(worker.spec["magic_line"])
    options = ProfileOptions.from_line(worker.spec["magic_line"])
    assert options == ProfileOptions(
        wait=0,
        active=2,
        count_flops=True,
        label=vs[1].name,
        out_dir="/tmp/runs",
        report=False,
        run_id=worker.options.run_id,
    )
    assert worker.spec["run_dir"] == str(Path("/tmp/runs") / options.run_id)
    assert magic[-3:] == ["--grad-ckpt", "--galore", "rank=64"]  # gap=200 is the default
    assert "--compare" not in magic and "--flash-attn" not in magic
    shutil.rmtree(worker.folder)


def test_replay_keeps_magics_drops_failed_and_marked_cells():
    assert prepare("%%swift_profile --active 2\ntrain()") == "train()"
    assert prepare("%%swift_profile --compare galore\ntrain()") == ""
    assert prepare("# swift_nb: skip\nupload()") == ""
    assert prepare("%swift_runs") == ""
    assert prepare("%load_ext swift_nb") == "%load_ext swift_nb"


@pytest.fixture(scope="module")
def session_kernel(tmp_path_factory):
    """A kernel of its own: a rerun replays the whole session, so it must hold only this."""
    from support.common import Kernel

    k = Kernel(tmp_path_factory.mktemp("rerun-kernel"))
    for code in ("%load_ext swift_nb", SETUP, "1 / 0  # fails: a rerun must not replay it", OPT):
        k.execute(code)
    yield k
    k.close()


def test_compare_in_a_session_leaves_the_kernel_untouched(session_kernel, tmp_path):
    k = session_kernel
    digest = (
        "__import__('hashlib').sha256(b''.join(p.detach().numpy().tobytes() for p in model.parameters()))"
        ".hexdigest()"
    )
    before = k.eval(digest)
    res = k.execute(
        f"%%swift_profile {FLAGS} --out {tmp_path} --compare flash_attention,grad_checkpointing,galore(rank=16)\n"
        + TRAIN,
        timeout=600,
    )
    assert res.status == "ok", res.outputs
    assert "Comparison" in "".join(o["data"].get("text/html", "") for o in res.of_type("display_data"))
    assert "image/png" in res.mimetypes() and "comparison: " in res.text("stdout")
    # the progress line is replaced in place: each update is the line itself, as text and HTML
    updates = [u["data"] for u in res.of_type("update_display_data")]
    assert updates and updates[-1]["text/plain"].startswith("reruns finished — baseline: ok")
    assert all(u["text/plain"].startswith(("rerun ", "reruns finished")) for u in updates), updates
    assert all("swift-nb-compare-progress" in u["text/html"] for u in updates)
    assert k.eval(digest) == before, "the kernel's weights changed"
    assert k.eval("(type(opt).__name__, model.blocks[0].attn.attn_impl)") == ("AdamW", "eager")
    order = ["baseline", "flash_attention", "grad_checkpointing", "galore(rank=16)"]
    by_variant = {r.context["variant"]: r for r in map(swift_nb.load_run, swift_nb.runs(tmp_path).path)}
    assert sorted(by_variant) == sorted(order)
    assert all(r.context["rerun_of"] is None for r in by_variant.values())
    table = swift_nb.compare(*(by_variant[v] for v in order)).set_index("variant")
    assert (table["status"] == "ok").all(), table["status"]
    base = table.loc["baseline"]
    assert table.loc["flash_attention", "peak_mem_ratio"] < 1.0
    assert table.loc["flash_attention", "activations_bytes"] < base["activations_bytes"]
    assert table.loc["grad_checkpointing", "activations_bytes"] < 0.5 * base["activations_bytes"]
    assert table.loc["galore(rank=16)", "optimizer_state_bytes"] < 0.5 * base["optimizer_state_bytes"]
    assert sum((Path(p) / "compare.html").is_file() for p in swift_nb.runs(tmp_path).path) == 1


def test_compare_flag_errors_are_usage_errors(session_kernel, tmp_path):
    res = session_kernel.execute(f"%%swift_profile --out {tmp_path} --compare galore(rank=0)\n{TRAIN}")
    assert "UsageError: --compare: galore rank must be ≥ 1; got 0" in res.text("stderr")
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_panel_rerun_button_compares_and_cancel_ends_the_worker(session_kernel, tmp_path):
    k = session_kernel
    # the cell sleeps after training so that Cancel, later, lands while a worker runs
    res = k.execute(f"%%swift_profile {FLAGS} --out {tmp_path}\n{TRAIN}import time\ntime.sleep(4)\n")
    assert res.status == "ok"
    wait = "import time\nwhile ctl._thread.is_alive():\n    time.sleep(0.2)\n"
    res = k.execute(
        "ctl = get_ipython().magics_manager.registry['SwiftMagics'].last_controls\n"
        "ctl.boxes['flash_attention'].value = True\nctl.rerun.click()\n" + wait,
        timeout=300,
    )
    assert res.status == "ok", res.outputs
    assert k.eval("ctl.compared.table[['variant', 'status']].values.tolist()") == [
        ["baseline", "ok"],
        ["flash_attention", "ok"],
    ]
    assert "Comparison" in k.eval("ctl.result.value") and "data:image/png" in k.eval("ctl.result.value")
    assert {swift_nb.load_run(p).context.get("rerun_of") for p in swift_nb.runs(tmp_path).path} >= {
        k.eval("ctl.run_id")
    }
    res = k.execute(
        "ctl.rerun.click()\n"
        "while 'profiling' not in ctl.status.value and ctl._thread.is_alive():\n    time.sleep(0.1)\n"
        "ctl.cancel.click()\n" + wait,
        timeout=300,
    )
    assert res.status == "ok", res.outputs
    assert "Cancelled" in k.eval("ctl.status.value")
    assert k.eval("ctl.rerun.disabled") is False
    assert _no_worker_of(k.eval("__import__('os').getpid()"))


def _no_worker_of(session: int) -> bool:
    """No rerun worker runs that the process ``session`` started, forked (named
    ``swift_nb-rerun``) or fresh (``python -m swift_nb.rerun.worker``)."""
    return _no_process_with(WORKER_NAME, started_by=session) and _no_process_with(
        "swift_nb.rerun.worker", started_by=session
    )


def _no_process_with(marker: str, started_by: int | None = None) -> bool:
    """No process runs whose command line holds ``marker``. ``started_by``: only those the
    process ``started_by`` started, or that outlived their parent (a test of another
    xdist worker may run reruns of its own at the same time)."""

    def ours(p: psutil.Process) -> bool:
        try:
            return started_by is None or p.ppid() == 1 or any(a.pid == started_by for a in p.parents())
        except psutil.Error:
            return False

    return not any(
        (marker == p.info["name"] or marker in " ".join(p.info["cmdline"] or [])) and ours(p)
        for p in psutil.process_iter(["name", "cmdline"])
    )


FAULTY = (
    "import os, subprocess, time\n"
    "rank = next((g['rank'] for g in opt.param_groups if 'rank' in g), None)\n"
    "ckpt = type(model.blocks[0]).__name__ == 'CheckpointWrapper'\n"
    "flash = model.blocks[0].attn.attn_impl == 'sdpa'\n"
    "if rank == 16:\n"
    "    raise RuntimeError('boom in the galore variant')\n"
    "if ckpt:\n"
    "    subprocess.Popen(['sleep', '301.25'])\n"
    "    os.abort()\n"
    "if flash:\n"
    "    subprocess.Popen(['sleep', '302.25'])\n"
    "    time.sleep(600)\n" + TRAIN
)

#: each variant's fault (FAULTY), in the order they run: how it ends, what its error says,
#: the process it started that must not outlive it; the last one, after three faults, is fine
FAULTS = {
    "galore(rank=16)": ("failed", "RuntimeError: boom in the galore variant", None),
    "grad_checkpointing": ("crashed", "killed by SIGABRT", "301.25"),
    "flash_attention": ("timeout", "no result after 25 s", "302.25"),
    "galore(rank=8)": ("ok", None, None),
}


def test_each_failing_variant_is_reported_and_the_others_still_run(tmp_path):
    """A variant that raises, one that aborts and one that hangs, one after another: each is
    reported with its own status and leaves nothing running, and the baseline before them
    and the variant after them run to the end."""
    outcomes = run_variants(
        [SETUP, OPT], FAULTY, FLAGS, parse_variants(",".join(FAULTS)), tmp_path, timeout_s=25
    )
    assert [o.variant for o in outcomes] == ["baseline", *FAULTS]
    by = {o.variant: o for o in outcomes}
    assert by["baseline"].status == "ok" and by["baseline"].run_path is not None
    table = swift_nb.rerun.comparison(
        [(o, swift_nb.load_run(o.run_path) if o.run_path else None) for o in outcomes]
    ).table.set_index("variant")
    for variant, (status, message, marker) in FAULTS.items():
        got = by[variant]
        assert got.status == status, got
        assert table.loc[variant, "status"] == status
        if message is not None:
            assert message in got.error
            assert message.split(":")[0] in table.loc[variant, "notes"]
        if marker:
            assert _no_process_with(marker), f"a process the worker started ({marker}) was left running"
    assert swift_nb.load_run(by["galore(rank=8)"].run_path).status == "ok"


def test_toggle_that_does_not_apply_is_noted_and_the_run_completes(tmp_path):
    mlp = (
        "import torch\nmodel = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    )
    train = (
        "for _ in range(4):\n    model(torch.randn(4, 8)).sum().backward()\n    opt.step(); opt.zero_grad()\n"
    )
    outcomes = run_variants(
        [mlp], train, FLAGS, parse_variants("flash_attention,galore"), tmp_path, timeout_s=120
    )
    assert [o.status for o in outcomes] == ["ok", "ok", "ok"]
    assert any("no attention module was found" in n for n in outcomes[1].notes), outcomes[1].notes
    assert any("GaLore replaces only Adam and AdamW" in n for n in outcomes[2].notes), outcomes[2].notes


def test_a_second_rerun_while_one_runs_is_refused(tmp_path):
    go = tmp_path / "go"
    # the first rerun's cell waits until the second has been refused
    waiting = f"import os, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n"
    done = threading.Event()
    errors: list[BaseException] = []

    def first():
        try:
            run_variants([], waiting, FLAGS, [], tmp_path / "a", timeout_s=60)
        except BaseException as e:  # surfaced below
            errors.append(e)
        finally:
            done.set()

    t = threading.Thread(target=first)
    t.start()
    deadline = time.monotonic() + 60
    while not launcher._busy.locked() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        with pytest.raises(RerunBusyError, match="a rerun is already in progress"):
            run_variants([], waiting, FLAGS, [], tmp_path / "b")
    finally:
        go.touch()
        t.join(120)
    assert done.is_set() and not errors


def test_compare_api_and_html(tmp_path):
    runs = []
    for label, toggles in (("plain", None), ("flash", ["flash_attention"])):
        ns: dict = {}
        exec(SETUP + OPT, ns)
        with swift_nb.profile(
            wait=0, warmup=1, active=2, out_dir=tmp_path, label=label, toggles=toggles, namespace=ns
        ) as run:
            exec(TRAIN, ns)
        runs.append(run)
    table = swift_nb.compare(*runs, html=True)
    assert list(table["variant"]) == ["plain", "flash"]
    assert table["step_time_ratio"].iloc[0] == 1.0
    assert table["peak_mem_ratio"].iloc[1] < 1.0
    html = (runs[0].path / "compare.html").read_text()
    assert "<table" in html and html.count("data:image/png;base64,") == 2 and "flash" in html
