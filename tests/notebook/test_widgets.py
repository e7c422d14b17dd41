"""The live panel and the results panel in a real kernel: what reaches the frontend over
iopub (widget messages, their number, the final state), interrupts, and the text-only
fallback of a terminal IPython."""

from __future__ import annotations

import queue
from contextlib import contextmanager
from datetime import datetime

from support.widgets import _newest

import swift_nb
from swift_nb.capture.session import PREVIEW_NOTE
from swift_nb.notebook.live import message_bound

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class Execution:
    """Every iopub message of one executed cell (comm messages included)."""

    def __init__(self, kernel, code: str, on_msg=None, timeout: float = 300) -> None:
        msg_id = kernel.kc.execute(code)
        self.msgs: list[dict] = []
        while True:
            try:
                msg = kernel.kc.get_iopub_msg(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"cell did not finish within {timeout}s:\n{code}") from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            self.msgs.append(msg)
            if on_msg is not None:
                on_msg(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        while True:
            reply = kernel.kc.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                self.status = reply["content"]["status"]
                break

    def of_type(self, *types: str) -> list[dict]:
        return [m for m in self.msgs if m["msg_type"] in types]

    def views(self) -> list[dict]:
        """Outputs that are widget views, in order: live panel, results panel (put in the
        place of the first results)."""
        return [
            m
            for m in self.of_type("display_data", "update_display_data")
            if WIDGET_VIEW in m["content"]["data"]
        ]

    def live_comms(self) -> dict[str, str]:
        """comm id → model name of the live panel's widgets: those opened before it was shown."""
        first_view = self.msgs.index(self.views()[0])
        return {
            m["content"]["comm_id"]: m["content"]["data"]["state"]["_model_name"]
            for m in self.msgs[:first_view]
            if m["msg_type"] == "comm_open"
        }

    def updates(self, comm_ids) -> list[dict]:
        """The state of each update message sent to ``comm_ids``."""
        return [
            m["content"]["data"]["state"]
            for m in self.of_type("comm_msg")
            if m["content"]["comm_id"] in comm_ids and m["content"]["data"].get("method") == "update"
        ]

    def final_state(self, comm_id: str) -> dict:
        state = dict(
            next(
                m["content"]["data"]["state"]
                for m in self.of_type("comm_open")
                if m["content"]["comm_id"] == comm_id
            )
        )
        for update in self.updates({comm_id}):
            state.update(update)
        return state

    def seconds(self, first: dict, last: dict) -> float:
        t0, t1 = (datetime.fromisoformat(str(m["header"]["date"])) for m in (first, last))
        return (t1 - t0).total_seconds()


def _live_parts(ex: Execution) -> tuple[str, str]:
    comms = ex.live_comms()
    bar = next(c for c, name in comms.items() if name == "IntProgressModel")
    html = [c for c, name in comms.items() if name == "HTMLModel"]
    text = next(c for c in html if "swift-nb-step" in ex.final_state(c)["value"])
    return bar, text


def test_live_panel_sends_a_bounded_number_of_messages_for_2000_steps(kernel, tmp_path):
    ex = Execution(kernel, f"%%swift_profile --out {tmp_path} --steps 2000\nm = train(2000)")
    assert ex.status == "ok"
    live, _results = ex.views()
    comms = ex.live_comms()
    sent = ex.updates(comms)
    seconds = ex.seconds(live, ex.msgs[-1])  # shown → cell done: longer than the panel ran
    print(f"live panel: {len(sent)} update messages over ≤ {seconds:.1f} s (bound {message_bound(seconds)})")
    assert len(sent) <= message_bound(seconds)
    assert len(sent) < 2000 / 4, "fewer messages than steps by far"
    bar, text = _live_parts(ex)
    final = ex.final_state(bar)
    assert (final["value"], final["max"], final["bar_style"]) == (2000, 2000, "success")
    assert "data-step='2000'" in ex.final_state(text)["value"]
    assert _newest(tmp_path).summary["steps"] == 2000


def test_interrupt_stops_the_panel_and_shows_the_partial_run(kernel, tmp_path):
    threads_before = kernel.eval("sorted(t.name for t in __import__('threading').enumerate())")
    interrupted = []

    def on_msg(msg):
        if msg["msg_type"] == "stream" and "step 4" in msg["content"].get("text", "") and not interrupted:
            interrupted.append(True)
            kernel.km.interrupt_kernel()

    ex = Execution(
        kernel,
        f"%%swift_profile --out {tmp_path} --wait 0 --warmup 0 --active 2 --steps 10000\n"
        "m = train(10_000, sleep_s=0.05)",
        on_msg=on_msg,
    )
    assert interrupted, "the loop never reached step 4"
    assert ex.status == "error"
    assert any(m["content"]["ename"] == "KeyboardInterrupt" for m in ex.of_type("error"))

    run = _newest(tmp_path)
    assert run.status == "interrupted"
    steps = run.summary["steps"]
    assert 5 <= steps < 10_000 and len(run.steps) == steps and len(run.samples) > 0
    for name in (*run.files.values(), "run.json"):
        assert (run.path / name).is_file(), name
    assert {"trace", "report"} <= set(run.files)

    assert len(ex.views()) == 2, "the live panel, then the results panel"
    bar, text = _live_parts(ex)
    final = ex.final_state(bar)
    assert (final["value"], final["max"], final["bar_style"]) == (steps, 10_000, "warning")
    assert "interrupted" in ex.final_state(text)["value"]
    statics = [
        m["content"]["data"] for m in ex.of_type("display_data") if WIDGET_VIEW not in m["content"]["data"]
    ]
    assert any("image/png" in d for d in statics)
    summary = next(d["text/html"] for d in statics if "swift-nb-summary" in d.get("text/html", ""))
    assert "interrupted" in summary
    assert kernel.eval("sorted(t.name for t in __import__('threading').enumerate())") == threads_before


@contextmanager
def digest(kernel, how: str):
    """The trace's digest in the kernel: ``done`` before the Summary is shown (it waits
    for it), or ``slow`` (it outlasts every wait: a fault injected), for one block."""
    kernel.execute(
        "import swift_nb.capture.session as _s\n"
        "from swift_nb.capture.torch_profiler import TraceRecorder as _T\n"
        "_kept = _s.PREVIEW_AFTER_S, _T.ready"
    )
    patch = {"done": "_s.PREVIEW_AFTER_S = 600", "slow": "_T.ready = lambda self, within: False"}[how]
    kernel.execute(patch)
    try:
        yield
    finally:
        kernel.execute("_s.PREVIEW_AFTER_S, _T.ready = _kept")


def _first_results(ex: Execution) -> tuple[dict, list[dict], list[dict]]:
    """The first output holding a Summary (checked to come before any figure), the updates
    that later replaced it in place, and the data of the outputs shown after it."""
    shown = ex.of_type("display_data", "update_display_data")
    first = next(
        i for i, m in enumerate(shown) if "swift-nb-summary" in m["content"]["data"].get("text/html", "")
    )
    early = shown[first]
    assert not any("image/png" in m["content"]["data"] for m in shown[:first]), "before any figure"
    display_id = early["content"]["transient"]["display_id"]
    replaced = [m for m in shown if m["content"].get("transient", {}).get("display_id") == display_id][1:]
    later = [m["content"]["data"] for m in shown[first + 1 :] if m["msg_type"] == "display_data"]
    return early, replaced, later


def test_the_summary_and_verdict_come_first_and_the_results_panel_takes_their_place(kernel, tmp_path):
    with digest(kernel, "done"):
        ex = Execution(kernel, f"%%swift_profile --out {tmp_path}\nm = train(8)")
    assert ex.status == "ok"
    early, replaced, later = _first_results(ex)
    assert early["msg_type"] == "display_data" and "<h2>Verdict</h2>" in early["content"]["data"]["text/html"]
    assert [m["msg_type"] for m in replaced] == ["update_display_data"]
    assert WIDGET_VIEW in replaced[0]["content"]["data"], "the results panel in their place"
    assert sum("swift-nb-summary" in d.get("text/html", "") for d in later) == 1, "the static Summary, once"
    assert sum("<h4>Verdict</h4>" in d.get("text/html", "") for d in later) == 1, "the static verdict, once"


def test_no_widgets_flag_shows_static_outputs_only(kernel, tmp_path):
    ex = Execution(kernel, f"%%swift_profile --out {tmp_path} --no-widgets\nm = train(3)")
    assert ex.status == "ok"
    assert not ex.views() and not ex.of_type("comm_open", "comm_msg")
    mimes = {k for m in ex.of_type("display_data") for k in m["content"]["data"]}
    assert {"text/html", "image/png", "text/plain"} <= mimes


def test_steps_hint_must_be_positive(kernel, tmp_path):
    ex = Execution(kernel, f"%%swift_profile --out {tmp_path} --steps 0\nm = train(3)")
    err = "".join(m["content"]["text"] for m in ex.of_type("stream") if m["content"]["name"] == "stderr")
    assert "--steps must be a whole number ≥ 1; got 0" in err
    assert not tmp_path.exists() or swift_nb.runs(tmp_path).empty


def test_a_summary_is_shown_while_the_trace_is_digested_then_the_runs_in_its_place(kernel, tmp_path):
    with digest(kernel, "slow"):
        ex = Execution(kernel, f"%%swift_profile --out {tmp_path}\nm = train(8)")
    assert ex.status == "ok"
    early, replaced, later = _first_results(ex)
    html = early["content"]["data"]["text/html"]
    assert early["msg_type"] == "display_data" and "<h2>Verdict</h2>" in html
    assert PREVIEW_NOTE in html and PREVIEW_NOTE in early["content"]["data"]["text/plain"]
    assert "Step time" in html, "the steps are measured before the trace is in"
    assert [m["msg_type"] for m in replaced] == ["update_display_data", "update_display_data"]
    full = replaced[0]["content"]["data"]
    assert "swift-nb-summary" in full["text/html"] and "<h2>Verdict</h2>" in full["text/html"]
    assert PREVIEW_NOTE not in full["text/html"], "the run's own Summary, once its trace is in"
    assert WIDGET_VIEW in replaced[1]["content"]["data"], "then the results panel in their place"
    assert sum("swift-nb-summary" in d.get("text/html", "") for d in later) == 1, "the static Summary, once"
    assert not any(PREVIEW_NOTE in d.get("text/html", "") for d in later)
    run = swift_nb.load_run(next(p for p in tmp_path.iterdir() if p.is_dir()))
    assert run.trace_path is not None and PREVIEW_NOTE not in run.notes
