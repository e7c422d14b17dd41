"""Does the training wait for swift_nb? Step by step, on a plain PyTorch model the project
does not ship (a 4-layer Transformer LM from ``torch.nn``), the way a user runs it:
``swift_nb.profile()`` with the default schedule and the report on.

Two modes, interleaved round by round so that drift of the machine hits both alike:
  bare      the loop alone
  profiled  the same loop inside ``with swift_nb.profile():`` (the wall time includes the
            report written after the block)
Per mode, for torch on every core and with one core left free (``--free-core``):
  - each step's time against the bare median step, over the steps after the profiler's
    window except the one that exports the trace (target: none above 1.25x);
  - the whole run's wall time, results included, against the bare one (target: 1.05x with
    torch on every core, 1.02x with a core free);
  - the training process's RSS while the trace is digested, against the bare loop's
    (target: at most +100 MB).

With ``--components``, what each piece of the capture costs a step after the window: the
profiled loop with every piece, then with one piece switched off in turn (the per-step
sample, the sampler thread, the journal, the stderr filter, the helper's digest during
the loop, the module scopes of the recorded steps; ``--pieces`` picks some), each against the bare loop of its own round: median and worst step after the
window, steps above 1.25x, the step hook's own time after the window (median), and the whole run with its report.

    python benchmarks/never_waits.py [--steps 120] [--rounds 3] [--threads 2] [--free-core]
    python benchmarks/never_waits.py --components [--steps 200] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator

import psutil
import torch
from torch import nn

import swift_nb


class LM(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(seq, width))
        layer = nn.TransformerEncoderLayer(
            width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.head(self.blocks(self.embed(x) + self.pos, mask=mask, is_causal=True))


def loop(model, opt, batches, times: list[float], rss: list[float]) -> None:
    proc = psutil.Process()
    for x, y in batches:
        t = time.perf_counter()
        logits = model(x)
        nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
        rss.append(proc.memory_info().rss / 2**20)


def _off(obj: object, name: str, value: object) -> Callable[[], contextlib.AbstractContextManager]:
    @contextlib.contextmanager
    def switched() -> Iterator[None]:
        saved = getattr(obj, name)
        setattr(obj, name, value)
        try:
            yield
        finally:
            setattr(obj, name, saved)

    return switched


def _components() -> dict[str, Callable[[], contextlib.AbstractContextManager]]:
    """Each piece of the capture, as a switch that turns it off."""
    from swift_nb.capture import journal, stderr_filter, torch_profiler
    from swift_nb.capture.memory.modules import ModuleScopes
    from swift_nb.capture.resources import sampler

    def digest_at_end(self, replay=None):  # the window's trace digested after the loop only
        if not getattr(self, "_finishing", False):
            return None
        return _digest(self, replay)

    _digest = torch_profiler.TraceRecorder.digest

    @contextlib.contextmanager
    def no_digest_in_loop() -> Iterator[None]:
        finish = torch_profiler.TraceRecorder.finish

        def finishing(self, replay=None):
            self._finishing = True
            return finish(self, replay)

        with (
            _off(torch_profiler.TraceRecorder, "digest", digest_at_end)(),
            _off(torch_profiler.TraceRecorder, "finish", finishing)(),
        ):
            yield

    return {
        "all": contextlib.nullcontext,
        "- step samples": _off(sampler.Sampler, "on_step", lambda self, sync=False: None),
        "- sampler thread": _off(sampler.Sampler, "start", lambda self, t0=None: None),
        "- journal": _off(journal.Journal, "start", lambda self: None),
        "- stderr filter": _off(stderr_filter.StderrFilter, "start", lambda self: None),
        "- digest in loop": no_digest_in_loop,
        "- module scopes": _off(ModuleScopes, "start", lambda self: None),
    }


def components(args, model, opt, batches, out: str) -> None:
    switches = {k: v for k, v in _components().items() if not args.pieces or k == "all" or k in args.pieces}
    rows: dict[str, list[dict]] = {name: [] for name in switches}
    for _ in range(args.rounds):
        for name, switch in switches.items():
            bare_times: list[float] = []
            t = time.perf_counter()
            loop(model, opt, batches, bare_times, [])
            bare_wall = time.perf_counter() - t
            times: list[float] = []
            with switch():
                t = time.perf_counter()
                with swift_nb.profile(out_dir=out, keep=2) as run:
                    loop(model, opt, batches, times, [])
                    last = time.perf_counter()
                done = time.perf_counter()
            window = run.schedule["wait"] + run.schedule["warmup"] + run.schedule["active"]
            med = statistics.median(bare_times)
            after = times[window:]
            rows[name].append(
                dict(
                    median=statistics.median(after) / med,
                    worst=max(after) / med,
                    over=sum(1 for s in after if s > 1.25 * med),
                    hook_us=1e6 * float(run.steps.loc[run.steps["phase"] == "none", "overhead_s"].median()),
                    wall=(done - t) / bare_wall,
                    exit_s=done - last,
                )
            )
    print(
        f"{'':<20}{'median step':>12}{'worst step':>11}{'>1.25x':>8}{'hook µs':>9}{'whole run':>10}{'exit s':>8}"
    )
    for name, found in rows.items():
        best = min(found, key=lambda row: row["wall"])
        print(
            f"{name:<20}{statistics.median(r['median'] for r in found):>12.3f}"
            f"{max(r['worst'] for r in found):>11.2f}{sum(r['over'] for r in found):>8d}"
            f"{statistics.median(r['hook_us'] for r in found):>9.0f}{best['wall']:>10.3f}"
            f"{statistics.median(r['exit_s'] for r in found):>8.2f}"
        )
    print(
        "median/worst step: after the window, against the same round's bare median; >1.25x: such "
        f"steps, all {args.rounds} rounds; whole run: best round, report included, against its bare loop"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=psutil.cpu_count(logical=True))
    ap.add_argument("--free-core", action="store_true", help="torch uses one core fewer than --threads")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--components", action="store_true", help="what each piece of the capture costs")
    ap.add_argument(
        "--pieces",
        nargs="*",
        default=[],
        help="with --components: only these (e.g. '- module scopes'), beside 'all'",
    )
    args = ap.parse_args()
    threads = max(1, args.threads - 1) if args.free_core else args.threads
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    vocab = 2000
    model = LM(vocab, args.width, args.layers, args.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = [
        (torch.randint(0, vocab, (args.batch, args.seq)), torch.randint(0, vocab, (args.batch, args.seq)))
        for _ in range(args.steps)
    ]
    loop(model, opt, batches[:3], [], [])  # warm up allocator and kernels
    out = tempfile.mkdtemp(prefix="swift_nb_never_waits_")
    if args.components:
        print(
            f"torch.nn Transformer LM: {args.layers} layers, width {args.width}, seq {args.seq}, "
            f"batch {args.batch}; {args.steps}-step runs, {args.rounds} rounds; "
            f"torch {torch.__version__} on {threads} of {psutil.cpu_count()} cores"
        )
        components(args, model, opt, batches, out)
        return

    steps: dict[str, list[list[float]]] = {"bare": [], "profiled": []}
    walls: dict[str, list[float]] = {"bare": [], "profiled": []}
    rss: dict[str, list[list[float]]] = {"bare": [], "profiled": []}
    window_end = 0
    exits: list[float] = []

    def bare(times, mem):
        loop(model, opt, batches, times, mem)

    def profiled(times, mem):
        nonlocal window_end
        with swift_nb.profile(out_dir=out, keep=2) as run:
            loop(model, opt, batches, times, mem)
            last = time.perf_counter()
        exits.append(time.perf_counter() - last)
        window_end = run.schedule["wait"] + run.schedule["warmup"] + run.schedule["active"]
        assert run.status == "ok" and (run.path / "report.html").exists()

    modes = {"bare": bare, "profiled": profiled}
    names = list(modes)
    for r in range(args.rounds):
        for name in names[r % 2 :] + names[: r % 2]:
            times: list[float] = []
            mem: list[float] = []
            t = time.perf_counter()
            modes[name](times, mem)
            walls[name].append(time.perf_counter() - t)
            steps[name].append(times)
            rss[name].append(mem)

    # Each profiled run against the bare run of its own round: the machine drifts by more
    # than the effects measured here between rounds (see the bare walls printed below).
    export = window_end - 1  # the step whose end exports the trace
    rounds = []
    for bare_steps, prof_steps, bare_wall, prof_wall, exit_s in zip(
        steps["bare"], steps["profiled"], walls["bare"], walls["profiled"], exits, strict=True
    ):
        med = statistics.median(bare_steps)
        after = prof_steps[export + 1 :]
        rounds.append(
            dict(
                median=statistics.median(after) / med,
                worst=max(after) / med,
                worst_at=after.index(max(after)) + 1,
                over=sum(1 for s in after if s > 1.25 * med),
                bare_worst=max(bare_steps[export + 1 :]) / med,
                bare_over=sum(1 for s in bare_steps[export + 1 :] if s > 1.25 * med),
                export=prof_steps[export] / med,
                wall=prof_wall / bare_wall,
                exit_s=exit_s,
            )
        )
    bare_rss = max(max(m) for m in rss["bare"])
    digest_rss = max(max(m[export:]) for m in rss["profiled"])
    target = "1.10" if args.steps < 300 else "1.05"

    def mid(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    print(
        f"torch.nn Transformer LM: {args.layers} layers, width {args.width}, seq {args.seq}, "
        f"batch {args.batch}; {args.steps}-step runs, {args.rounds} interleaved rounds; "
        f"torch {torch.__version__} on {threads} of {psutil.cpu_count()} cores"
    )
    print(
        f"bare median step {1e3 * statistics.median(s for run in steps['bare'] for s in run):.1f} ms; "
        f"profiler window ends with step {export}; each run against its round's bare run"
    )
    table = [
        ("median step after the window / bare median", f"{mid('median'):.3f}", "1.01"),
        ("worst step after the window / bare median", f"{max(r['worst'] for r in rounds):.2f}", "1.25"),
        ("  the bare loop's own worst step", f"{max(r['bare_worst'] for r in rounds):.2f}", ""),
        ("steps after the window above 1.25x", f"{sum(r['over'] for r in rounds)}", "0"),
        ("  the bare loop's own steps above 1.25x", f"{sum(r['bare_over'] for r in rounds)}", ""),
        ("exporting step / bare median", f"{max(r['export'] for r in rounds):.2f}", "-"),
        (
            "whole run incl. report / bare (median, best)",
            f"{mid('wall'):.3f}, {min(r['wall'] for r in rounds):.3f}",
            target,
        ),
        ("last step -> report written (median s)", f"{mid('exit_s'):.2f}", "0.5"),
        ("RSS while digesting - bare (MB)", f"{digest_rss - bare_rss:+.0f}", "+100"),
    ]
    print(f"{'':<46}{'measured':>14}{'target':>8}")
    for label, value, goal in table:
        print(f"{label:<46}{value:>14}{goal:>8}")
    print(
        "walls (s): bare "
        + " ".join(f"{w:.2f}" for w in walls["bare"])
        + "; profiled "
        + " ".join(f"{w:.2f}" for w in walls["profiled"])
        + "; whole run / bare per round "
        + " ".join(f"{r['wall']:.3f}" for r in rounds)
    )
    print(
        "worst step after the window per round (x bare median, which step after the export; "
        "the bare run's own worst): "
        + "; ".join(f"{r['worst']:.2f} at +{r['worst_at']} ({r['bare_worst']:.2f})" for r in rounds)
    )


if __name__ == "__main__":
    main()
