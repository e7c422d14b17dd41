"""``swift-nb``: list runs, print a run's summary, (re)write a run's report.html, compare runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from swift_nb.api import compare, report
from swift_nb.record import COMPARE_FILE, REPORT_FILE, load_run, runs
from swift_nb.render.compare import compare_table_text
from swift_nb.render.tables import runs_text, summary_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="swift-nb", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="recent runs, newest first")
    p_list.add_argument(
        "root",
        nargs="?",
        default=None,
        help="folder of run folders (default $SWIFT_NB_DIR or ./swift_nb_runs)",
    )
    p_list.add_argument("-n", type=int, default=20, help="how many runs (default 20)")
    p_show = sub.add_parser("show", help="summary of one run")
    p_show.add_argument("run_dir")
    p_report = sub.add_parser("report", help="analyse a run folder and write its report.html")
    p_report.add_argument("run_dir")
    p_cmp = sub.add_parser("compare", help="compare runs side by side (the first is the baseline)")
    p_cmp.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p_cmp.add_argument(
        "-o", "--out", default=None, help=f"where to write the page (default RUN_DIR/{COMPARE_FILE})"
    )
    args = parser.parse_args(argv)
    if args.command == "list":
        print(runs_text(runs(args.root, limit=args.n)))
        return 0
    if args.command == "compare":
        return _compare(args.run_dirs, args.out)
    try:
        run = load_run(args.run_dir)
    except (FileNotFoundError, ValueError) as e:
        print(f"swift-nb: {e}", file=sys.stderr)
        return 2
    if args.command == "report":
        reported = report(run)
        run, analysis = reported.run, reported.analysis
        if analysis is not None:
            print(f"verdict: {analysis.verdict.kind} — {analysis.verdict.reason}")
            for f in analysis.findings:
                print(f"finding: {f.title}")
        assert run.path is not None  # a loaded run has its folder
        print(run.path / run.files.get("report", REPORT_FILE))
        return 0
    print(summary_text(run))
    return 0


def _compare(run_dirs: list[str], out: str | None) -> int:
    try:
        loaded = [load_run(d) for d in run_dirs]
    except (FileNotFoundError, ValueError) as e:
        print(f"swift-nb: {e}", file=sys.stderr)
        return 2
    table = compare(*loaded, html=True)
    print(compare_table_text(table))
    assert loaded[0].path is not None  # a loaded run has its folder
    page = loaded[0].path / COMPARE_FILE
    if out is not None:
        Path(out).write_bytes(page.read_bytes())
        page = Path(out)
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
