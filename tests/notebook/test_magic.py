"""The %%swift_profile front in a real kernel: outputs, failures, interrupts, bad input."""

from __future__ import annotations

import re
import time

import pytest
import torch

import swift_nb


def _newest(root):
    table = swift_nb.runs(root)
    assert len(table), f"no run recorded under {root}"
    return swift_nb.load_run(table.path[0])


def test_output_and_value_behave_as_without_the_magic(kernel, tmp_path):
    res = kernel.execute(f"%%swift_profile --out {tmp_path}\nm = train(3)\nprint('hello')\n6 * 7")
    assert res.status == "ok"
    assert "hello" in res.text("stdout")
    (value,) = res.of_type("execute_result")
    assert value["data"]["text/plain"] == "42"
    assert {"text/html", "image/png"} <= res.mimetypes()
    assert _newest(tmp_path).summary["steps"] == 3


def test_user_stderr_passes_profiler_noise_does_not(kernel, tmp_path):
    res = kernel.execute(
        f"%%swift_profile --out {tmp_path} --wait 0 --warmup 1 --active 2\n"
        "import os, sys\n"
        "os.write(2, b'user fd line\\n')\n"
        "m = train(5)\n"
        "print('user py line', file=sys.stderr)"
    )
    assert res.status == "ok"
    err = res.text("stderr")
    assert "user fd line" in err and "user py line" in err
    assert "USDT" not in err and "profiler_start" not in err


def test_failing_cell_shows_original_traceback_and_saves_failed_run(kernel, tmp_path):
    threads_before = kernel.eval("sorted(t.name for t in __import__('threading').enumerate())")
    res = kernel.execute(f"%%swift_profile --out {tmp_path}\nm = train(4)\n1 / 0")
    assert res.status == "error", "the outer cell must fail so Run All stops"
    (err,) = res.of_type("error")
    assert err["ename"] == "ZeroDivisionError"
    tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(err["traceback"]))
    assert "1 / 0" in tb and "swift_nb" not in tb and "run_cell_magic" not in tb
    assert {"text/html", "image/png"} <= res.mimetypes()
    run = _newest(tmp_path)
    assert run.status == "failed"
    assert run.summary["steps"] == 4
    assert any("ZeroDivisionError" in n for n in run.notes)
    assert kernel.eval("sorted(t.name for t in __import__('threading').enumerate())") == threads_before


def test_interrupt_saves_what_was_measured(kernel, tmp_path):
    seen = []

    def on_output(msg):
        if msg["msg_type"] == "stream" and "step 4" in msg["content"].get("text", "") and not seen:
            seen.append(time.time())
            kernel.km.interrupt_kernel()

    res = kernel.execute(
        f"%%swift_profile --out {tmp_path}\nm = train(10_000, sleep_s=0.05)", on_output=on_output
    )
    assert seen, "the loop never reached step 4"
    assert res.status == "error"
    assert any(e["ename"] == "KeyboardInterrupt" for e in res.of_type("error"))
    run = _newest(tmp_path)
    assert run.status == "interrupted"
    assert 5 <= run.summary["steps"] < 10_000
    assert len(run.samples) > 0
    assert kernel.eval("1 + 1") == 2  # the kernel is still usable


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("--active 0", "--active must be a whole number ≥ 1; got 0"),
        ("--interval-ms -5", "--interval-ms must be a positive number of milliseconds; got -5.0"),
        ("--bogus", "unrecognized arguments: --bogus"),
        ("--warmup x", "argument --warmup: invalid int value: 'x'"),
    ],
)
def test_bad_flags_are_one_line_usage_errors_and_the_cell_does_not_run(kernel, tmp_path, flags, expected):
    kernel.execute("ran = False")
    res = kernel.execute(f"%%swift_profile {flags} --out {tmp_path}\nran = True")
    usage = res.text("stderr")
    assert "UsageError" in usage and expected in usage
    assert usage.strip().count("\n") == 0, usage
    assert kernel.eval("ran") is False
    assert not list(tmp_path.iterdir()) or swift_nb.runs(tmp_path).empty


def test_unwritable_output_folder_is_refused_before_the_cell_runs(kernel, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    kernel.execute("ran = False")
    res = kernel.execute(f"%%swift_profile --out {blocker}/runs\nran = True")
    assert "cannot write run records" in res.text("stderr")
    assert kernel.eval("ran") is False


def test_list_shows_recent_runs(kernel, tmp_path):
    kernel.execute(f"%%swift_profile --out {tmp_path} --label listed\nm = train(2)")
    res = kernel.execute(f"%swift_profile --list --out {tmp_path}")
    assert res.status == "ok"
    assert "listed" in res.text() and "text/html" in res.mimetypes()


def test_open_shows_a_run_recorded_elsewhere(kernel, tmp_path):
    from support.common import train

    with swift_nb.profile(out_dir=tmp_path, label="from-a-script", wait=0, warmup=1, active=1) as run:
        train(3)
    res = kernel.execute(f"%swift_profile --open {run.path}")
    assert res.status == "ok", res.outputs
    html = "".join(o["data"].get("text/html", "") for o in res.of_type("display_data"))
    assert "from-a-script" in html and "image/png" in res.mimetypes()
    bad = kernel.execute(f"%swift_profile --open {tmp_path / 'nope'}")
    assert "UsageError: --open:" in bad.text("stderr")


def test_flops_flag_counts_a_step(kernel, tmp_path):
    res = kernel.execute(
        f"%%swift_profile --out {tmp_path} --flops --wait 0 --warmup 1 --active 1\nm = train(4)"
    )
    assert res.status == "ok", res.outputs
    run = _newest(tmp_path)
    # Linear(16, 16) on a batch of 4: forward 2·4·16·16, backward the same again for the
    # weight's gradient (the input needs none)
    assert run.summary["flops_per_step"] == 2 * (2 * 4 * 16 * 16)
    html = "".join(o["data"].get("text/html", "") for o in res.of_type("display_data"))
    assert re.search(r"FLOPs per step</t[hd]>\s*<td[^>]*>4\.10 kFLOP<", html), "the report shows the count"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("--activation-offload", "--activation-offload needs a CUDA device, and torch"),
        ("--fp8", "--fp8 needs a CUDA device of compute capability ≥ 8.9"),
        ("--liger", "on a CUDA device, and this machine has none"),
    ],
)
def test_a_cuda_only_toggle_is_refused_naming_cuda_before_the_cell_runs(kernel, tmp_path, flag, expected):
    kernel.execute("ran = False; import torch; net = torch.nn.Linear(4, 4)")
    res = kernel.execute(f"%%swift_profile {flag} --out {tmp_path}\nran = True")
    assert expected in res.text("stderr") + res.text("stdout") + str(res.of_type("error"))
    assert kernel.eval("ran") is False
    kernel.execute("del net")


def test_plan_shows_what_would_make_the_newest_run_fit(kernel, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    res = kernel.execute(f"%swift_profile --plan 24GB --out {empty}")
    assert "UsageError: --plan needs a profiled run" in res.text("stderr")
    kernel.execute(f"%%swift_profile --out {tmp_path / 'runs'} --wait 0 --warmup 1 --active 2\nm = train(4)")
    res = kernel.execute(f"%swift_profile --plan 1MB --batch 64 --out {tmp_path / 'runs'}")
    assert res.status == "ok", res.outputs
    html = "".join(o["data"].get("text/html", "") for o in res.of_type("display_data"))
    assert "What would make it fit?" in html and "swift-nb-plan" in html
    bad = kernel.execute(f"%swift_profile --plan Z80-64KB --out {tmp_path / 'runs'}")
    assert "UsageError: --plan: device must be one of" in bad.text("stderr")
