"""Time to analyze a run and render its report, on a run with a large trace.

Profiles the demo GPT with enough layers and active steps for a large trace (about 43 MB
of JSON with the defaults), then times: the analysis and report right after capture (the
path of every profiled cell: the trace's events are still in memory), and from the run
folder alone: parsing the trace, every analysis (``swift_nb.analysis.analyze``) and
rendering report.html with its figures.

    python benchmarks/analysis.py [--layers 12] [--active 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import tempfile
import time

import torch

from swift_nb.analysis import analyze
from swift_nb.analysis.trace.tables import load_trace
from swift_nb.api import ReportAhead, report
from swift_nb.capture.session import Session
from swift_nb.demo import GPT, GPTConfig
from swift_nb.record import tables_path
from swift_nb.render.document import analysis_fields, report_html
from swift_nb.vocabulary.options import ProfileOptions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--active", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    torch.manual_seed(0)
    cfg = GPTConfig(seq_len=128, n_layer=args.layers, d_model=128, n_head=4, vocab_size=512)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, cfg.vocab_size, (8, cfg.seq_len))
    ahead = ReportAhead()
    session = Session(
        ProfileOptions(wait=0, warmup=1, active=args.active, out_dir=tempfile.mkdtemp()), on_trace=ahead
    )
    session.start()
    for _ in range(args.active + 1):
        model(x, x).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    run = session.stop()
    t = time.perf_counter()
    ahead.take(session.take_trace_tables())
    report(run, figures=ahead.figures)
    in_session = time.perf_counter() - t
    with gzip.open(run.trace_path, "rb") as f:
        size_mb = len(f.read()) / 2**20

    cache = tables_path(run.trace_path)
    cold, parse, analysis, render = [], [], [], []
    for _ in range(args.repeats):
        cache.unlink(missing_ok=True)
        t0 = time.perf_counter()
        load_trace(run)  # decodes the JSON and writes the tables
        t1 = time.perf_counter()
        load_trace(run)
        t2 = time.perf_counter()
        result = analyze(run)  # loads the tables again: analyze is what a user calls
        t3 = time.perf_counter()
        report_html(run, **analysis_fields(result))
        t4 = time.perf_counter()
        cold.append(t1 - t0)
        parse.append(t2 - t1)
        analysis.append(t3 - t2)
        render.append(t4 - t3)
    print(
        f"trace: {size_mb:.1f} MB JSON, {run.summary['trace_events']:,} events, {args.active} profiled steps "
        f"of a {args.layers}-layer GPT; median of {args.repeats}"
    )
    a, r = statistics.median(analysis), statistics.median(render)
    print(f"{'decode trace JSON (cold)':<34} {statistics.median(cold):6.2f} s")
    print(f"{'load trace tables (warm)':<34} {statistics.median(parse):6.2f} s")
    print(f"{'analyze() (incl. warm load)':<34} {a:6.2f} s")
    print(f"{'render report.html':<34} {r:6.2f} s")
    print(f"{'analyze + render, run folder':<34} {a + r:6.2f} s")
    print(f"{'analyze + render, cold':<34} {statistics.median(cold) + a + r:6.2f} s")
    print(f"{'right after capture':<34} {in_session:6.2f} s  (swift_nb.report, events in memory)")


if __name__ == "__main__":
    main()
