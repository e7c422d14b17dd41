"""``swift-nb``: list runs, print a run's summary, (re)write a run's report.html, compare runs,
say what changed between two (a gate for CI with limits), import torch.profiler traces
recorded anywhere as runs, send a run to MLflow, W&B or TensorBoard."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections.abc import Iterator
from concurrent.futures import Executor
from pathlib import Path

from swift_nb.analysis.comparison.run_diff import REGRESSION, diff, gate
from swift_nb.core.errors import ConfigError, MissingDependencyError, RecordError
from swift_nb.importing.assembly import import_trace
from swift_nb.importing.pool import RanksNotReadError
from swift_nb.record import COMPARE_FILE, REPORT_FILE, Run, load_run, runs
from swift_nb.render.comparison.page import compare_table_text
from swift_nb.render.comparison.run_diff import SHOWN_ROWS, diff_text
from swift_nb.render.oom import oom_text
from swift_nb.render.tables import runs_text, summary_text
from swift_nb.reporting import compare, report
from swift_nb.trackers import export
from swift_nb.vocabulary.options import TARGETS

EPILOG = """\
exit status:
  0  done (warnings about a record, e.g. a table missing, go to stderr)
  1  could not do what was asked: a damaged run record or trace (the file and what is
     wrong with it are printed), or a report whose analysis could not run (a damaged trace,
     steps.csv missing: report.html is written and says why); or `diff` found run B
     regressed beyond a --max-…-regression-pct limit (what changed is printed first); or
     an import whose worker was lost (the traces not read are named; no run is written)
  2  usage error: bad arguments (a limit that is not a percentage ≥ 0), a folder that is
     not a run folder, a trace path that does not exist, or --scheduler without
     swift_nb[cluster] installed or without a scheduler answering there

A damaged run is listed by `list` with status "damaged" and its problem."""

OK, FAILED, USAGE = 0, 1, 2


def main(argv: list[str] | None = None) -> int:
    """``swift-nb COMMAND ...``: the exit status (0 ok, 1 a gate failed or a run could not be
    read, 2 bad usage)."""
    args = _parser().parse_args(argv)
    if args.command == "import":
        return _import(args.traces, args.out, args.label, args.scheduler, _prices(args))
    if args.command == "list":
        print(runs_text(runs(args.root, limit=args.n)))
        return OK
    if args.command == "compare":
        dirs = args.run_dirs
    elif args.command == "diff":
        dirs = [args.run_a, args.run_b]
    else:
        dirs = [args.run_dir]
    loaded = _load(dirs)
    if isinstance(loaded, int):
        return loaded
    if args.command == "diff":
        return _diff(
            loaded[0], loaded[1], args.max_step_regression_pct, args.max_memory_regression_pct, args.rows
        )
    if args.command == "compare":
        return _compare(loaded, args.out)
    if args.command == "report":
        return _report(loaded[0], _prices(args))
    if args.command == "export":
        return _export(loaded[0], args)
    return _show(loaded[0])


def _parser() -> argparse.ArgumentParser:
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
    p_report = sub.add_parser("report", help="analyze a run folder and write its report.html")
    p_report.add_argument("run_dir")
    _price_flags(p_report)
    p_cmp = sub.add_parser("compare", help="compare runs side by side (the first is the baseline)")
    p_cmp.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p_cmp.add_argument(
        "-o", "--out", default=None, help=f"where to write the page (default RUN_DIR/{COMPARE_FILE})"
    )
    _add_diff(sub)
    _add_import(sub)
    _add_export(sub)
    return parser


def _add_diff(sub: argparse._SubParsersAction) -> None:
    p_diff = sub.add_parser(
        "diff",
        help="what changed from run A to run B: environment, step time, memory, kernels and operators "
        "per step; with limits, a gate for CI",
    )
    p_diff.add_argument("run_a", metavar="A", help="the reference run's folder")
    p_diff.add_argument("run_b", metavar="B", help="the run checked against it")
    for what in ("step", "memory"):
        p_diff.add_argument(
            f"--max-{what}-regression-pct",
            type=_limit,
            default=None,
            metavar="PCT",
            help=f"exit 1 when B's {'median step time' if what == 'step' else 'peak tensor memory'} "
            f"is more than PCT %% above A's",
        )
    p_diff.add_argument(
        "--rows", type=_rows, default=SHOWN_ROWS, help=f"changes shown, largest first (default {SHOWN_ROWS})"
    )


def _add_import(sub: argparse._SubParsersAction) -> None:
    p_import = sub.add_parser(
        "import",
        help="turn torch.profiler traces (.json/.json.gz, one per rank, or folders of them) into a run",
    )
    p_import.add_argument("traces", nargs="+", metavar="TRACE", help="trace files or folders of them")
    p_import.add_argument(
        "-o", "--out", default=None, help="folder of run folders (default $SWIFT_NB_DIR or ./swift_nb_runs)"
    )
    p_import.add_argument("--label", default=None, help="a name for the run")
    p_import.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="a Dask scheduler (tcp://HOST:8786) whose workers read the ranks; they must see the traces "
        "and the output folder at the same paths (pip install 'swift_nb[cluster]')",
    )
    _price_flags(p_import)


def _add_export(sub: argparse._SubParsersAction) -> None:
    p_export = sub.add_parser(
        "export",
        help="send a run to an experiment tracker: summary, per-step series, findings, report and trace",
    )
    p_export.add_argument("run_dir")
    p_export.add_argument("--to", required=True, choices=sorted(TARGETS), help="the tracker")
    p_export.add_argument(
        "--tracking-uri", default=None, help="mlflow: the tracking URI (sqlite:///mlflow.db, http://…)"
    )
    p_export.add_argument("--experiment-name", default=None, help="mlflow: the experiment (made if missing)")
    p_export.add_argument("--dir", default=None, help="wandb: the folder of its local files")
    p_export.add_argument("--project", default=None, help="wandb: the project (default swift_nb)")
    p_export.add_argument(
        "--log-dir", default=None, help="tensorboard: the event folder (default runs/RUN_ID)"
    )


def _price_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--price-per-hour",
        type=_price,
        default=None,
        metavar="USD",
        help="what one device (GPU) costs an hour, for the run's cost (default $SWIFT_NB_PRICE_PER_HOUR "
        "or the GPU's list price)",
    )
    parser.add_argument(
        "--price-per-kwh", type=_price, default=None, metavar="USD", help="what a kWh costs, for the energy's"
    )


Prices = tuple[float | None, float | None]  # (USD per device-hour, USD per kWh)


def _prices(args: argparse.Namespace) -> Prices:
    return args.price_per_hour, args.price_per_kwh


def _price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a price in USD, a number ≥ 0 such as 2.5; got {text!r}")
    return value


#: each tracker's own arguments, as the command line names them
_EXPORT_ARGS = {
    "mlflow": ("tracking_uri", "experiment_name"),
    "wandb": ("dir", "project"),
    "tensorboard": ("log_dir",),
}


def _export(run: Run, args: argparse.Namespace) -> int:
    given = {
        k: getattr(args, k) for names in _EXPORT_ARGS.values() for k in names if getattr(args, k) is not None
    }
    foreign = sorted(k for k in given if k not in _EXPORT_ARGS[args.to])
    if foreign:
        _error(f"--{foreign[0].replace('_', '-')} is not an argument of {args.to}")
        return USAGE
    try:
        where = export(run, to=args.to, **given)
    except (ConfigError, MissingDependencyError) as e:
        _error(str(e))
        return USAGE
    print(f"sent {run.path} to {args.to}: {where}")
    return OK


def _limit(text: str) -> float:
    """A regression limit as given on the command line: a percentage ≥ 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(
            f"must be a percentage ≥ 0 (5 allows a 5 % regression); got {text!r}"
        )
    return value


def _rows(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number ≥ 1; got {text!r}")
    return int(text)


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


def _report(run: Run, prices: Prices = (None, None)) -> int:
    already = set(run.problems)
    reported = report(run, price_per_hour=prices[0], price_per_kwh=prices[1])
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


@contextlib.contextmanager
def _scheduler(address: str | None) -> Iterator[Executor | None]:
    """The executor of a Dask client connected to ``address`` (closed after), or None."""
    if address is None:
        yield None
        return
    try:
        from distributed import Client
    except ImportError:
        raise MissingDependencyError(
            "--scheduler needs Dask's distributed package: pip install 'swift_nb[cluster]'"
        ) from None
    try:
        client = Client(address)
    except OSError as e:  # nothing answering there (a timeout is an OSError too)
        raise ConfigError(
            "--scheduler", f"must be the address of a running Dask scheduler ({e})", address
        ) from None
    with client:
        yield client.get_executor()


def _import(
    traces: list[str],
    out: str | None,
    label: str | None,
    scheduler: str | None = None,
    prices: Prices = (None, None),
) -> int:
    try:
        with _scheduler(scheduler) as executor:
            run = import_trace(
                traces,
                out,
                label=label,
                report=False,
                executor=executor,
                price_per_hour=prices[0],
                price_per_kwh=prices[1],
            )
    except (ConfigError, MissingDependencyError) as e:
        _error(str(e))
        return USAGE
    except (RecordError, RanksNotReadError) as e:
        _error(str(e))
        return FAILED
    print(f"imported {len(run.rank_trace_paths())} trace(s) as {run.path}")
    return _report(run, prices)


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


def _diff(a: Run, b: Run, max_step_pct: float | None, max_memory_pct: float | None, rows: int) -> int:
    """What changed from ``a`` to ``b``, printed; then the limits checked: exit 1 when
    ``b`` breaks one."""
    try:
        d = diff(a, b)
    except RecordError as e:
        _error(str(e))
        return FAILED
    print(diff_text(d, rows))
    outcomes = gate(d, max_step_pct, max_memory_pct)
    for outcome, words in outcomes:
        print(f"{outcome}: {words}")
    return FAILED if any(outcome == REGRESSION for outcome, _ in outcomes) else OK


if __name__ == "__main__":
    sys.exit(main())
