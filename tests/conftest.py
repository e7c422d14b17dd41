"""Shared fixtures of every tier: tiny training loops, and one real IPython kernel for
notebook tests. Each tier's folder (unit/, integration/, notebook/, browser/) has a conftest
that marks its tests with the tier's name (tests/README.md). A run that skips a test not
listed in tests/allowed_skips.txt fails (``SkipCheck``)."""

from __future__ import annotations

import sys
from fnmatch import fnmatch
from pathlib import Path

# jsonschema (nbformat's) checks the "iri" format with rfc3987_syntax where it is installed
# (jupyter-events asks for it), which builds a grammar at its import: 2.3 s of CPU in each
# test process, for a format no notebook schema uses. Without it jsonschema skips that check.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[assignment]

import pytest  # noqa: E402 (after the line above)
from support.common import Kernel  # noqa: E402 (after the line above)
from support.demo_run import profile_demo_gpt  # noqa: E402 (after the line above)

from swift_nb.record import Run  # noqa: E402 (after the line above)


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture(scope="session")
def kernel(tmp_path_factory) -> Kernel:
    """One kernel for all notebook-front tests, with swift_nb loaded and a tiny loop defined."""
    cwd = tmp_path_factory.mktemp("kernel")
    k = Kernel(cwd)
    setup = k.execute(
        "%load_ext swift_nb\n"
        "import torch, time\n"
        "def train(steps, sleep_s=0.0):\n"
        "    torch.manual_seed(0)\n"
        "    m = torch.nn.Linear(16, 16)\n"
        "    o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "    for i in range(steps):\n"
        "        m(torch.randn(4, 16)).sum().backward()\n"
        "        o.step(); o.zero_grad()\n"
        "        if sleep_s:\n"
        "            print(f'step {i}', flush=True)\n"
        "            time.sleep(sleep_s)\n"
        "    return m\n"
    )
    assert setup.status == "ok", setup.outputs
    yield k
    k.close()


@pytest.fixture(scope="session")
def demo_gpt(tmp_path_factory) -> Run:
    """The demo GPT's profiled run that tests whose sizes don't matter share (read it, never
    change it; a report may be written into its folder): ``support.demo_run``."""
    return profile_demo_gpt(tmp_path_factory.mktemp("demo_gpt"))


#: the tiers in the order their tests run in one process (SWIFT_NB_TEST_WORKERS=0): the
#: longest files first. pytest-xdist hands out files by their number of tests instead
#: (most first: the notebooks' few long tests then run beside the unit tier's many short
#: ones, which measured faster on 2 cores than running the long files together first)
TIER_ORDER = ("notebook", "browser", "integration", "unit")
#: the files that take minutes (reruns, ranks, DDP jobs), first within their tier
LONG_FIRST = (
    "test_rerun.py",
    "test_ranks.py",
    "test_advisor.py",
    "test_data_parallel.py",
    "test_sequence_parallel.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def order(item: pytest.Item) -> tuple[int, int]:
        parts = item.path.parts
        tier = next((i for i, t in enumerate(TIER_ORDER) if t in parts), len(TIER_ORDER))
        long = LONG_FIRST.index(item.path.name) if item.path.name in LONG_FIRST else len(LONG_FIRST)
        return tier, long

    items.sort(key=order)  # stable: the order within a file is kept


#: the skips a run may have: a skip not listed there fails the run, so that an extra that
#: failed to install cannot pass CI by skipping the tests that need it
ALLOWED_SKIPS = Path(__file__).with_name("allowed_skips.txt")


def allowed_skips() -> list[tuple[str, str]]:
    """(test id glob, reason glob) of each line ``<test id glob> | <reason glob>``."""
    allowed = []
    for n, line in enumerate(ALLOWED_SKIPS.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        test, sep, reason = line.partition(" | ")
        if not sep:
            raise pytest.UsageError(
                f"{ALLOWED_SKIPS}:{n}: expected '<test id glob> | <reason glob>', got {line!r}"
            )
        allowed.append((test.strip(), reason.strip()))
    return allowed


class SkipCheck:
    """Every skip of the run (a test's, or a module's at collection), listed at the end of
    the run; one not in ``allowed`` fails the run. Registered where the reports arrive: in
    the one pytest process, or on pytest-xdist's controller, which its workers send their
    test and collection reports to."""

    def __init__(self, allowed: list[tuple[str, str]]) -> None:
        self.allowed = allowed
        #: (test id, reason) → allowed
        self.skips: dict[tuple[str, str], bool] = {}

    def _add(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        longrepr = report.longrepr
        said = longrepr[2] if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3 else str(longrepr)
        reason = str(said).removeprefix("Skipped: ")
        ok = any(fnmatch(report.nodeid, t) and fnmatch(reason, r) for t, r in self.allowed)
        self.skips[(report.nodeid, reason)] = ok

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:
            self._add(report)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self._add(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # a run whose every module was skipped at collection collected no test (exit 5)
        passing = (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
        if not all(self.skips.values()) and session.exitstatus in passing:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.skips:
            return
        name = ALLOWED_SKIPS.relative_to(ALLOWED_SKIPS.parents[1])
        terminalreporter.write_sep("=", f"skipped ({name} lists those allowed)")
        for (test, reason), ok in sorted(self.skips.items()):
            terminalreporter.write_line(f"{'allowed' if ok else 'NOT ALLOWED':<11}  {test}: {reason}")
        unlisted = sum(not ok for ok in self.skips.values())
        if unlisted:
            terminalreporter.write_line(
                f"{unlisted} of {len(self.skips)} skips are not in {name}: the run fails. Install what "
                f"they need (bash scripts/setup.sh test), or list them there with the reason they may skip",
                red=True,
                bold=True,
            )


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # an xdist worker sends its reports on
        config.pluginmanager.register(SkipCheck(allowed_skips()), "swift_nb_skip_check")
