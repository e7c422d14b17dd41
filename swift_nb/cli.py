"""``swift-nb``: list runs, print a run's summary, (re)write a run's report.html, compare runs,
import torch.profiler traces recorded anywhere as runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from swift_nb.api import compare, report
from swift_nb.errors import ConfigError, RecordError
from swift_nb.importer import import_trace
from swift_nb.record import COMPARE_FILE, REPORT_FILE, Run, load_run, runs
from swift_nb.render.compare import compare_table_text
from swift_nb.render.oom import oom_text
from swift_nb.render.tables import runs_text, summary_text

EPILOG = """\
exit status:
  0  done (warnings about a record, e.g. a table missing, go to stderr)
  1  could not do what was asked: a damaged run record or trace (the file and what is
     wrong with it are printed), or a report whose analysis could not run (a damaged trace,
     steps.csv missing: report.html is written and says why)
  2  usage error: bad arguments, a folder that is not a run folder, or a trace path that
     does not exist

A damaged run is listed by `list` with status "damaged" and its problem."""

OK, FAILED, USAGE = 0, 1, 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="swift-nb",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="recent runs, newest first")
    p_list.add_argument(
        "root",
        nargs="?",
        default=None,
        help="folder of run folders (default $SWIFT_NB_DIR or ./swift_nb_runs)",
    )
    p_list.add_argument("-n", type=int, default=20, help="how many runs (default 20)")
    p_show = sub.add_parser("show", help="summary of one run (and the traceback of a failed one)")
    p_show.add_argument("run_dir")
    p_report = sub.add_parser("report", help="analyse a run folder and write its report.html")
    p_report.add_argument("run_dir")
    p_cmp = sub.add_parser("compare", help="compare runs side by side (the first is the baseline)")
    p_cmp.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p_cmp.add_argument(
        "-o", "--out", default=None, help=f"where to write the page (default RUN_DIR/{COMPARE_FILE})"
    )
    p_import = sub.add_parser(
        "import",
        help="turn torch.profiler traces (.json/.json.gz, one per rank, or folders of them) into a run",
    )
    p_import.add_argument("traces", nargs="+", metavar="TRACE", help="trace files or folders of them")
    p_import.add_argument(
        "-o", "--out", default=None, help="folder of run folders (default $SWIFT_NB_DIR or ./swift_nb_runs)"
    )
    p_import.add_argument("--label", default=None, help="a name for the run")
    args = parser.parse_args(argv)
    if args.command == "import":
        return _import(args.traces, args.out, args.label)
    if args.command == "list":
        print(runs_text(runs(args.root, limit=args.n)))
        return OK
    loaded = _load(args.run_dirs if args.command == "compare" else [args.run_dir])
    if isinstance(loaded, int):
        return loaded
    if args.command == "compare":
        return _compare(loaded, args.out)
    if args.command == "report":
        return _report(loaded[0])
    return _show(loaded[0])


def _error(message: str) -> None:
    print(f"swift-nb: {message}", file=sys.stderr)


def _load(run_dirs: list[str]) -> list[Run] | int:
    """The runs, their problems printed as warnings; or the exit status of the first that
    cannot be loaded, its reason printed."""
    loaded = []
    for d in run_dirs:
        try:
            run = load_run(d)
        except FileNotFoundError as e:
            _error(str(e))
            return USAGE
        except RecordError as e:
            _error(str(e))
            return FAILED
        for problem in run.problems:
            _error(f"warning: {problem}")
        loaded.append(run)
    return loaded


def _show(run: Run) -> int:
    print(summary_text(run))
    post_mortem = oom_text(run)
    if post_mortem is not None:
        print(f"\n{post_mortem}")
    traceback = run.summary.get("traceback")
    if traceback:
        print(f"\n{traceback.rstrip()}")
    return OK


def _report(run: Run) -> int:
    already = set(run.problems)
    reported = report(run)
    run, analysis = reported.run, reported.analysis
    for problem in run.problems:
        if problem not in already:
            _error(problem)
    if analysis is not None:
        print(f"verdict: {analysis.verdict.kind} — {analysis.verdict.reason}")
        for f in analysis.findings:
            print(f"finding: {f.title}")
    assert run.path is not None  # a loaded run has its folder
    print(run.path / run.files.get("report", REPORT_FILE))
    return OK if analysis is not None else FAILED


def _import(traces: list[str], out: str | None, label: str | None) -> int:
    try:
        run = import_trace(traces, out, label=label, report=False)
    except ConfigError as e:
        _error(str(e))
        return USAGE
    except RecordError as e:
        _error(str(e))
        return FAILED
    print(f"imported {len(run.rank_trace_paths())} trace(s) as {run.path}")
    return _report(run)


def _compare(loaded: list[Run], out: str | None) -> int:
    table = compare(*loaded, html=True)
    print(compare_table_text(table))
    assert loaded[0].path is not None  # a loaded run has its folder
    page = loaded[0].path / COMPARE_FILE
    if out is not None:
        Path(out).write_bytes(page.read_bytes())
        page = Path(out)
    print(page)
    return OK


if __name__ == "__main__":
    sys.exit(main())
