"""Time to analyse a run and render its report, on a run with a large trace.

Profiles the demo GPT with enough layers and active steps for a trace of about
--trace-mb MB (uncompressed JSON), then times, separately: parsing the trace, every
analysis (``swift_nb.analysis.analyze``), and rendering report.html with its figures.

    python benchmarks/analysis.py [--layers 12] [--active 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import tempfile
import time

import torch

import swift_nb
from swift_nb.analysis import analyze
from swift_nb.analysis.trace import load_trace
from swift_nb.demo import GPT, GPTConfig
from swift_nb.render.report import render_report


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
    with swift_nb.profile(out_dir=tempfile.mkdtemp(), wait=0, warmup=1, active=args.active) as run:
        for _ in range(args.active + 1):
            model(x, x).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    with gzip.open(run.trace_path, "rb") as f:
        size_mb = len(f.read()) / 2**20

    parse, analysis, render = [], [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        load_trace(run)
        t1 = time.perf_counter()
        result = analyze(run)  # parses again: analyze is what a user calls
        t2 = time.perf_counter()
        render_report(run, result)
        t3 = time.perf_counter()
        parse.append(t1 - t0)
        analysis.append(t2 - t1)
        render.append(t3 - t2)
    print(
        f"trace: {size_mb:.1f} MB JSON, {run.summary['trace_events']:,} events, {args.active} profiled steps "
        f"of a {args.layers}-layer GPT; median of {args.repeats}"
    )
    print(f"{'parse trace':<28} {statistics.median(parse):6.2f} s")
    print(f"{'analyze() (incl. parse)':<28} {statistics.median(analysis):6.2f} s")
    print(f"{'render report.html':<28} {statistics.median(render):6.2f} s")
    print(f"{'analyse + render':<28} {statistics.median(analysis) + statistics.median(render):6.2f} s")


if __name__ == "__main__":
    main()
