"""``%%swift_profile``: profile an unmodified training cell.

The cell runs through the shell's own ``run_cell``, so its output, its last expression
and its traceback look exactly as without the magic. When it fails, the magic marks the
outer cell failed too (so "Run all" and nbclient stop) without a second traceback.
While the cell runs, a live panel shows its progress (``live.py``); afterwards the run is
shown as a results panel and as static outputs (``panel.py``). In a terminal, or with
``--no-widgets``, only the static outputs.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import ArgDecorator, argument, construct_parser, magic_arguments
from IPython.display import DisplayHandle, display

from swift_nb import toggles as toggle_registry
from swift_nb import vocabulary
from swift_nb.api import ReportAhead, apply_toggles, finish, report, undo_toggles
from swift_nb.capture import helper
from swift_nb.capture.session import Session
from swift_nb.core.errors import ConfigError, MissingDependencyError, RunDirError
from swift_nb.notebook.live import LivePanel
from swift_nb.notebook.panel import show_first, show_run
from swift_nb.record import Run, load_run, runs
from swift_nb.render.sections import Section
from swift_nb.render.tables import runs_html, runs_text
from swift_nb.vocabulary.options import ProfileOptions, argparse_specs, flag_of


def cell_source(cell: str) -> dict[str, Any]:
    """How a notebook cell is identified in the record: a hash, never its text."""
    return {"cell_sha1": hashlib.sha1(cell.encode("utf-8")).hexdigest(), "cell_lines": cell.count("\n") + 1}


class ProfiledCellError(Exception):
    """Raised after a profiled cell failed and its traceback was shown, to mark the
    outer cell failed without showing anything more."""


def _option_arguments(func):
    """The ``ProfileOptions`` flags, each as an ``@argument`` (one home: ``options.py``)."""
    for args, kwargs in reversed(argparse_specs()):
        func = argument(*args, **kwargs)(func)
    return func


class _ToggleArguments(ArgDecorator):
    """One flag per toggle of the vocabulary that has one (``--galore rank=64,gap=200``),
    taking an optional ``key=value,...`` spec; ``flags`` are those the parser was built with."""

    flags: tuple[str, ...] = ()

    def add_to_parser(self, parser, group):
        self.flags = tuple(e.id for e in vocabulary.flagged())
        for words in vocabulary.flagged():
            parser.add_argument(
                f"--{words.flag}",
                dest=words.dest,
                nargs="?",
                const="",
                default=None,
                metavar=words.metavar,
                help=words.help,
            )


_toggle_arguments = _ToggleArguments()


def _keep_description(func):
    """The help's description stays the docstring when the parser is built again."""
    func.argcmd_kwds = {"description": func.__doc__}
    return func


def _parser():
    """The magic's parser, built again (help included) when a toggle joined the vocabulary
    since it was built."""
    func = SwiftMagics.swift_profile
    if _toggle_arguments.flags != tuple(e.id for e in vocabulary.flagged()):
        func.parser = construct_parser(func)
    return func.parser


def _toggle_flag(param: str) -> str:
    """Names a toggle parameter as the magic spells it: ``galore rank`` → ``--galore rank``."""
    return vocabulary.param_flag(param, flag_of)


def _toggles(args) -> list[toggle_registry.Toggle]:
    return [
        toggle_registry.parse(words.id, getattr(args, words.dest))
        for words in vocabulary.flagged()
        if getattr(args, words.dest, None) is not None
    ]


def parse_line(line: str):
    """The magic's arguments, split as a shell would (``--out '/my runs'`` is one path;
    IPython's own splitting keeps the quotes)."""
    try:
        argv = shlex.split(line)
    except ValueError as e:
        raise UsageError(f"%%swift_profile {line}: {e}") from None
    return _parser().parse_args(argv)


@magics_class
class SwiftMagics(Magics):
    @magic_arguments()
    @_keep_description
    @_option_arguments
    @argument("--list", action="store_true", help="show recent runs instead of profiling")
    @argument(
        "--plan",
        type=str,
        default=None,
        metavar="DEVICE",
        help="what would make the newest run (or --open RUN_DIR) fit on DEVICE (a preset such as L4-24GB, or "
        "24GB): the toggles' combinations forecast, best first; no profiling",
    )
    @argument(
        "--batch", type=int, default=None, help="with --plan: the batch size to fit (default the run's)"
    )
    @argument(
        "--seq", type=int, default=None, help="with --plan: the sequence length to fit (default the run's)"
    )
    @argument(
        "--steps",
        type=int,
        default=None,
        help="steps the cell will run, for the live panel's progress and ETA (a hint; nothing is cut)",
    )
    @argument(
        "--no-widgets",
        action="store_true",
        help="no live panel or results tabs: static outputs only",
    )
    @_toggle_arguments
    @argument(
        "--open",
        type=str,
        default=None,
        metavar="RUN_DIR",
        help="show a saved run (one a script or a torchrun job recorded) instead of profiling",
    )
    @argument(
        "--compare",
        type=str,
        default=None,
        metavar="VARIANTS",
        help="rerun the session in worker processes: a baseline, then each variant "
        "(e.g. flash_attention,grad_checkpointing+galore(rank=64)); the kernel's objects are not touched",
    )
    @argument(
        "--setup", type=str, default=None, help="with --compare: a file to run instead of the session history"
    )
    @argument("--timeout", type=float, default=None, help="with --compare: seconds before a worker is ended")
    @line_cell_magic
    def swift_profile(self, line: str, cell: str | None = None) -> None:
        """Profile a training cell: torch.profiler on a step schedule plus resource
        sampling; every optimizer.step() (or swift_nb.step()) ends a step.

        Usage: ``%%swift_profile [--active 5] [--label NAME] ...`` on top of a cell, or
        ``%swift_profile --list`` for recent runs. The toggles' flags (``--flash-attn``,
        ``--grad-ckpt``, ``--galore rank=64,gap=200``, ``--bf16``, … : see ``swift_nb.vocabulary``)
        apply optimizations for this run only: to the models and optimizers in the notebook's
        variables and to those the cell constructs; they are undone when the cell ends.
        ``--compare`` reruns the cell with variants of them; ``--forecast`` adds "will it fit"
        configurations to the report.
        """
        args = parse_line(line)
        if args.list:
            self._show_runs(args.out)
            return
        if args.plan is not None:
            self._plan(args)
            return
        if args.open is not None:
            self._open(args.open, panel=not args.no_widgets and widgets_available(self.shell))
            return
        if cell is None:
            raise UsageError("%swift_profile needs a cell: use %%swift_profile on top of the cell, or --list")
        if args.steps is not None and args.steps < 1:
            raise UsageError(f"--steps must be a whole number ≥ 1; got {args.steps}")
        if args.compare is not None:
            self._compare(cell, args)
            return
        session, toggles = self._prepare(cell, args)
        live = result = None
        try:
            if not args.no_widgets and widgets_available(self.shell):
                live = LivePanel(session, total_steps=args.steps)
                live.show()
                live.start()
            result = self.shell.run_cell(cell, store_history=False)
        finally:
            if live is not None:
                live.stop()
            for report in undo_toggles(session, toggles):
                print(report)
            err = None if result is None else (result.error_before_exec or result.error_in_exec)
            first: list[DisplayHandle | None] = []  # a kernel's frontend replaces it in place

            def early(r: Run, s: list[Section]) -> None:  # a preview's first, then the run's in its place
                shown = show_first(r, s, first[0] if first else None)
                first[:] = [shown]

            shows_early = early if widgets_available(self.shell) else None
            try:
                reported = finish(session, _cell_status(result, err), err, shows_early, timeline_png=True)
            except BaseException:
                if live is not None:
                    live.end_saving()  # its line would tick on for a run that will not be shown
                raise
            run = reported.run
            actions = None
            if live is not None:
                live.close(run)
                actions = _rerun_controls(self.shell, session.options, cell, run, reported)
            show_run(run, reported.sections, live is not None, actions, first[0] if first else None)
        if err is not None:
            raise ProfiledCellError(run.id)

    def _prepare(self, cell: str, args) -> tuple[Session, list[toggle_registry.Toggle]]:
        """The started session with its toggles applied; every bad input is a UsageError
        raised before anything runs or stays applied."""
        try:
            toggles = _toggles(args)
        except ConfigError as e:
            raise UsageError(e.message(_toggle_flag)) from None
        except MissingDependencyError as e:
            raise UsageError(str(e)) from None
        try:
            session = Session(
                ProfileOptions.from_args(args), source=cell_source(cell), on_trace=ReportAhead()
            )
        except ConfigError as e:
            raise UsageError(e.message(flag_of)) from None
        except RunDirError as e:
            raise UsageError(str(e)) from None
        try:
            apply_toggles(session, toggles, self.shell.user_ns)
        except (ConfigError, RuntimeError) as e:  # e.g. sequence_parallel outside a multi-rank rerun
            raise UsageError(str(e)) from None
        try:
            session.start(self.shell.user_ns)
        except RuntimeError as e:  # another profile is active (a nested %%swift_profile)
            undo_toggles(session, toggles)
            raise UsageError(str(e)) from None
        return session, toggles

    def _open(self, path: str, panel: bool) -> None:
        try:
            run = load_run(path)
        except (FileNotFoundError, ValueError) as e:
            raise UsageError(f"--open: {e}") from None
        reported = report(run)
        show_run(reported.run, reported.sections, panel=panel)

    def _compare(self, cell: str, args) -> None:
        from swift_nb.notebook.variants_view import run_comparison
        from swift_nb.rerun import RerunBusyError, parse_variants

        if _toggles(args):
            raise UsageError(
                "--compare takes the toggles in its list (e.g. --compare flash_attention,galore)"
            )
        if args.timeout is not None and args.timeout <= 0:
            raise UsageError(f"--timeout must be a positive number of seconds; got {args.timeout}")
        try:
            variants = parse_variants(args.compare)
        except ConfigError as e:
            raise UsageError(f"--compare: {e}") from None
        except MissingDependencyError as e:
            raise UsageError(str(e)) from None
        try:
            options = ProfileOptions.from_args(args)
        except ConfigError as e:
            raise UsageError(e.message(flag_of)) from None
        try:
            run_comparison(self.shell, options, cell, variants, args.out, args.setup, args.timeout)
        except (RerunBusyError, FileNotFoundError) as e:
            raise UsageError(str(e)) from None

    @line_cell_magic
    def swift_runs(self, line: str, cell: str | None = None) -> None:
        """Show recent runs: ``%swift_runs [FOLDER]``."""
        self._show_runs(line.strip() or None)

    def _plan(self, args) -> None:
        """``--plan DEVICE``: the plan table of the newest run under ``--out`` (or ``--open``);
        its device, ``--batch`` and ``--seq`` are checked before a run is read."""
        from swift_nb.api import check_target, plan
        from swift_nb.core.devices import is_capacity
        from swift_nb.render.plan import TITLE, plan_html, plan_text

        flags = {"batch_size": "--batch", "seq_len": "--seq"}
        try:
            device = check_target(device=args.plan, batch_size=args.batch, seq_len=args.seq)["device"]
        except ConfigError as e:
            raise UsageError(e.message(lambda name: flags.get(name, f"--plan: {name}"))) from None
        try:
            if args.open is not None:
                run = load_run(args.open)
            else:
                table = runs(args.out, limit=1)
                if table.empty:
                    raise UsageError(
                        "--plan needs a profiled run: profile a cell first, or give --open RUN_DIR"
                    )
                run = load_run(table.iloc[0]["path"])
            budget = device.capacity_bytes if is_capacity(args.plan) else None
            result = plan(
                run,
                device=None if budget is not None else args.plan,
                memory_bytes=budget,
                batch_size=args.batch,
                seq_len=args.seq,
            )
        except (ConfigError, FileNotFoundError, ValueError) as e:
            raise UsageError(f"--plan: {e}") from None
        display(
            {"text/html": f"<h4>{TITLE}</h4>" + plan_html(result), "text/plain": plan_text(result)}, raw=True
        )
        self.last_plan = result

    def _show_runs(self, root: str | None) -> None:
        table = runs(root, limit=20)
        display({"text/html": runs_html(table), "text/plain": runs_text(table)}, raw=True)


def _rerun_controls(shell, options: ProfileOptions, cell: str, run: Run, reported):
    """The Advice tab's rerun controls, or None where reruns cannot start (inside a rerun
    worker, or a run that was not saved)."""
    from swift_nb.notebook.rerun_panel import RerunControls
    from swift_nb.rerun.history import replay_cells
    from swift_nb.rerun.launcher import WORKER_ENV

    if os.environ.get(WORKER_ENV) or run.path is None:
        return None
    findings = reported.analysis.findings if reported.analysis is not None else []
    controls = RerunControls(shell, options, cell, replay_cells(shell), run.id, findings, run.path.parent)
    shell.magics_manager.registry["SwiftMagics"].last_controls = controls  # for code driving the panel
    return controls.widget()


def _cell_status(result, err: BaseException | None) -> str:
    """The run's status from the inner cell's result (None: it never returned)."""
    if result is None or isinstance(err, KeyboardInterrupt):
        return "interrupted"
    return "failed" if err is not None else "ok"


def widgets_available(shell) -> bool:
    """Whether widgets can be shown: a kernel (Jupyter, VS Code, nbclient) has a frontend
    that may render them; a terminal IPython has none, and gets text only."""
    return getattr(shell, "kernel", None) is not None


def load_ipython_extension(ip) -> None:
    ip.register_magics(SwiftMagics)
    helper.prewarm()  # its imports done while the notebook is idle, before the first profiled cell
    if ProfiledCellError in ip.custom_exceptions:
        return
    previous, prev_handler = tuple(ip.custom_exceptions), ip.CustomTB

    def handler(shell, etype, value, tb, tb_offset=None):
        if issubclass(etype, ProfiledCellError):
            return []
        return prev_handler(etype, value, tb, tb_offset=tb_offset)

    ip.set_custom_exc((*previous, ProfiledCellError), handler)
