"""What ``torch.compile`` did during a run: the seconds each step spent compiling, and
each compile, recompile and graph break with its step, reason and the user's line.

Three of torch's own records, read as torch 2.13 writes them:

- ``torch._dynamo.callback.callback_handler``: its start and end callbacks bracket every
  outermost compile — dynamo tracing a frame (with the backend's compile inside it) and
  AOTAutograd's lazy backward compile at the first backward — on the thread that compiles.
  Timing that bracket is the only record that says *when* the compile ran, so which step it
  belongs to; the cumulative timers (``compilation_time_metrics``) say how long but not
  when, and would have to be summed at every step boundary.
- ``torch._dynamo.utils.get_compilation_metrics()``: one ``CompilationMetrics`` per frame
  compile, with its compile id (the callbacks carry the same id), the compiled function
  (``co_name``, ``co_filename``, ``co_firstlineno``) and, for a recompile, the guard that
  failed (``recompile_reason``). It is a bounded deque (64 entries), so it is read at the
  step boundary after a compile, not once at the end.
- dynamo's ``graph_breaks`` log (``symbolic_convert.graph_break_log``): the one record of a
  graph break that holds both its user file:line and its reason (``counters["graph_break"]``
  holds reasons without lines; ``restart_reasons`` in the metrics likewise). Its first line,
  "Graph break in user code at FILE:LINE", is pinned by dynamo's own tests. The logger is
  opened at DEBUG for the run only, with its records kept from the user's handlers unless
  the user enabled it (``TORCH_LOGS=graph_breaks``), and restored after.

Not the structured trace (``TORCH_TRACE``): a handler on it makes dynamo format and hash
every artifact of every compile (graphs, guards, generated code), a cost added to the very
compile time measured here.

The hot path is one ``len()`` per step boundary; nothing is read while no compile ran.
Without ``torch._dynamo`` (a build without it, or one whose callbacks moved) the recorder
does nothing and says why in ``unavailable``.
"""

from __future__ import annotations

import logging
import re
import sys
import sysconfig
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

#: a graph break's log record: its first line and its reason (up to the user's traceback)
_BREAK = re.compile(
    r"in user code at (?P<file>[^\n]+):(?P<line>\d+)\nGraph Break Reason: (?P<reason>.*?)(?:\n\nUser code traceback:|\Z)",
    re.DOTALL,
)
#: a recompile reason's guard line: ``0/0: tensor 'x' size mismatch …  # source  # file:line``
_GUARD_ID = re.compile(r"^\d+/\d+:\s*")
_USER_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
#: dynamo's preamble before the reason proper
_PREAMBLE = "Encountered graph break"


@cache
def _library_dirs() -> tuple[str, ...]:
    """Folders whose code is not the user's: the standard library, installed packages
    (torch among them) and swift_nb itself."""
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    dirs.add(str(Path(__file__).resolve().parents[1]))
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        dirs.add(str(Path(torch.__file__).resolve().parent))
    return tuple(d.rstrip("/") + "/" for d in dirs)


def is_user_file(filename: str | None) -> bool:
    """Whether ``filename`` is the user's code (a script, a notebook cell's file), not a
    library's or Python's own."""
    return bool(filename) and not filename.startswith(_library_dirs()) and not filename.startswith("<frozen")


def _user_site() -> str | None:
    """The innermost line of the user's code on this thread's stack (file:line): where the
    compiled model was called from, while dynamo compiles it."""
    frame = sys._getframe(2)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


@dataclass
class _Span:
    """One outermost compile as the callbacks bracket it (perf_counter seconds)."""

    compile_id: str
    trigger: str  # DYNAMO | LAZY_BACKWARD | …
    step: int
    seconds: float


class _BreakHandler(logging.Handler):
    """Keeps dynamo's graph-break records with the step and compile they happened in."""

    def __init__(self, recorder: CompileRecorder) -> None:
        super().__init__(logging.DEBUG)
        self._recorder = recorder

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # a record we cannot format is not a break we can name
            return
        self._recorder._breaks.append((text, self._recorder.step, self._recorder._current_id()))


class CompileRecorder:
    """Records torch.compile's work for one session: ``install()`` at the start,
    ``at_boundary()`` at each step boundary (the seconds the step just ended spent
    compiling), ``remove()`` when the capture stops, then ``events()``/``summary()``."""

    def __init__(self) -> None:
        self.step = 0  # the step in progress
        self.unavailable: str | None = None
        self._spans: list[_Span] = []
        self._open: dict[str, tuple[int, float]] = {}
        self._sites: dict[str, str | None] = {}  # compile id → the user's line calling it
        self._booked = 0  # spans already charged to a step
        self._metrics: dict[str, Any] = {}  # compile id → its CompilationMetrics
        self._breaks: list[tuple[str, int, str | None]] = []
        self._handler: _BreakHandler | None = None
        self._log: logging.Logger | None = None
        self._log_state: tuple[int, bool] | None = None
        self._installed = False
        self._wall0 = 0.0

    # -- lifecycle -------------------------------------------------------------------------

    def install(self) -> None:
        """Start listening. torch's optimizers and profiler import ``torch._dynamo`` on
        first use anyway; importing it here moves that one-time cost before the first step."""
        try:
            from torch._dynamo import symbolic_convert
            from torch._dynamo.callback import callback_handler
        except Exception as e:  # torch built without dynamo, or its callbacks moved
            self.unavailable = (
                f"torch._dynamo's compile callbacks could not be read ({type(e).__name__}: {e})"
            )
            return
        self._wall0 = time.time()
        callback_handler.register_start_callback(self._on_start)
        callback_handler.register_end_callback(self._on_end)
        self._installed = True
        log = getattr(symbolic_convert, "graph_break_log", None)
        if isinstance(log, logging.Logger):
            self._log = log
            self._handler = _BreakHandler(self)
            if not log.isEnabledFor(logging.DEBUG):
                # open it for our handler only: the user did not ask to see graph breaks
                self._log_state = (log.level, log.propagate)
                log.setLevel(logging.DEBUG)
                log.propagate = False
            log.addHandler(self._handler)

    def remove(self) -> None:
        """Stop listening and restore dynamo's logger (safe to call twice)."""
        if self._installed:
            from torch._dynamo.callback import callback_handler

            for callbacks, fn in (
                (callback_handler.start_callbacks, self._on_start),
                (callback_handler.end_callbacks, self._on_end),
            ):
                if fn in callbacks:
                    callbacks.remove(fn)
            self._installed = False
        if self._log is not None and self._handler is not None:
            self._log.removeHandler(self._handler)
            if self._log_state is not None:
                self._log.setLevel(self._log_state[0])
                self._log.propagate = self._log_state[1]
            self._handler = self._log_state = None
        self._collect()

    # -- dynamo's callbacks (on the compiling thread, inside dynamo's compile lock) ----------

    def _on_start(self, args: Any) -> None:
        cid = str(args.compile_id)
        if cid not in self._sites:
            self._sites[cid] = _user_site()
        self._open[cid] = (self.step, time.perf_counter())

    def _on_end(self, args: Any) -> None:
        t = time.perf_counter()
        cid = str(args.compile_id)
        step, t0 = self._open.pop(cid, (self.step, t))
        trigger = getattr(args.callback_trigger, "name", str(args.callback_trigger))
        self._spans.append(_Span(cid, trigger, step, t - t0))

    @staticmethod
    def _current_id() -> str | None:
        try:
            from torch._guards import CompileContext

            cid = CompileContext.current_compile_id()
        except Exception:
            return None
        return str(cid) if cid is not None else None

    # -- step boundaries (hot path) ----------------------------------------------------------

    def at_boundary(self) -> float:
        """Seconds of compiling the step in progress held (it ends now); the next begins."""
        n = len(self._spans)
        self.step += 1
        if n == self._booked:
            return 0.0
        seconds = sum(s.seconds for s in self._spans[self._booked : n])
        self._booked = n
        self._collect()
        return seconds

    def _collect(self) -> None:
        """Keep the metrics of this session's compiles before dynamo's deque drops them."""
        wanted = {s.compile_id for s in self._spans if s.trigger == "DYNAMO"} - self._metrics.keys()
        if not wanted:
            return
        try:
            from torch._dynamo.utils import get_compilation_metrics

            records = get_compilation_metrics()
        except Exception:
            return
        for m in records:
            cid = str(getattr(m, "compile_id", None))
            start = getattr(m, "start_time", None)
            if cid in wanted and getattr(m, "co_name", None) and (start is None or start >= self._wall0 - 1):
                self._metrics[cid] = m

    # -- what the run records ----------------------------------------------------------------

    @property
    def compiled(self) -> bool:
        return bool(self._spans or self._breaks)

    def events(self) -> list[dict[str, Any]]:
        """Each compile and recompile (one per compile id; its lazy backward compile's
        seconds added), then each distinct graph break (where and reason) at the step it
        was first met, in step order. Keys: kind (compile | recompile | graph_break), step,
        seconds (compiling, s; None for a graph break: it costs at run time, not to
        compile), reason (the guard that failed; the break's reason), where (the user's
        file:line: the compiled function's when it is the user's code, else the line that
        called it; the failed guard's source line when dynamo names it; the break's line),
        function, compile_id; a graph break adds
        explanation, hints and url as dynamo words them."""
        by_id: dict[str, dict[str, Any]] = {}
        for s in self._spans:
            ev = by_id.get(s.compile_id)
            if ev is None:
                ev = by_id[s.compile_id] = self._compile_event(s)
            ev["seconds"] += s.seconds
        out = list(by_id.values())
        seen: set[tuple[str, str]] = set()
        for text, step, cid in self._breaks:
            ev = _break_event(text, step, cid)
            if ev is not None and (ev["where"], ev["reason"]) not in seen:
                seen.add((ev["where"], ev["reason"]))
                out.append(ev)
        return sorted(out, key=lambda e: e["step"])

    def _compile_event(self, s: _Span) -> dict[str, Any]:
        m = self._metrics.get(s.compile_id)
        guard = getattr(m, "recompile_reason", None) if m is not None else None
        recompile = bool(guard) or not s.compile_id.endswith("/0")
        # the compiled function when it is the user's; else (a module of torch's own, such as
        # nn.Sequential, whose frame is dynamo's wrapper) the user's line that called it
        own = m is not None and is_user_file(m.co_filename)
        where = f"{m.co_filename}:{m.co_firstlineno}" if own else self._sites.get(s.compile_id)
        reason = None
        if guard:
            first = guard.splitlines()[0]
            reason = _GUARD_ID.sub("", first.split("  #")[0]).strip()
            lines = [found for found in _USER_LINE.findall(guard) if is_user_file(found[0])]
            if lines:
                where = f"{lines[-1][0]}:{lines[-1][1]}"
        return {
            "kind": "recompile" if recompile else "compile",
            "step": s.step,
            "seconds": 0.0,
            "reason": reason,
            "where": where,
            "function": m.co_name if own else None,  # not torch's wrapper
            "compile_id": s.compile_id,
        }

    def add_to(self, run: Any) -> None:
        """Into ``run`` (a ``swift_nb.record.Run``): the summary's compile keys (when the
        callbacks were installed), and ``context["compile"]["events"]`` when anything
        compiled; why nothing could be read, as a note."""
        if self.unavailable is not None:
            if self.unavailable not in run.notes:
                run.notes.append(self.unavailable)
            return
        run.summary.update(self.summary())
        if self.compiled:
            run.context["compile"] = {"events": self.events()}

    def summary(self) -> dict[str, Any]:
        """compile_s (all compiling, s), recompiles, graph_breaks (distinct: a break met
        again when its frame recompiles is one break)."""
        events = self.events()
        return {
            "compile_s": sum(s.seconds for s in self._spans),
            "recompiles": sum(e["kind"] == "recompile" for e in events),
            "graph_breaks": sum(e["kind"] == "graph_break" for e in events),
        }


def _break_event(text: str, step: int, compile_id: str | None) -> dict[str, Any] | None:
    m = _BREAK.search(text)
    if m is None:
        return None
    lines = [ln.strip() for ln in m["reason"].splitlines()]
    body = [ln for ln in lines if ln and not ln.startswith(_PREAMBLE)]
    reason = next(
        (ln for ln in body if not ln.startswith(("Explanation:", "Hint:", "Developer debug", "For more"))),
        body[0] if body else m["reason"].strip(),
    )
    url = next((ln.split("visit:", 1)[1].strip() for ln in body if "visit:" in ln), None)
    explanation = next(
        (ln.removeprefix("Explanation:").strip() for ln in body if ln.startswith("Explanation:")), None
    )
    return {
        "kind": "graph_break",
        "step": step,
        "seconds": None,
        "reason": reason,
        "where": f"{m['file']}:{m['line']}",
        "function": None,
        "compile_id": compile_id,
        "explanation": explanation,
        "hints": [ln.removeprefix("Hint:").strip() for ln in body if ln.startswith("Hint:")],
        "url": url,
    }
