"""Shared fixtures of every tier: tiny training loops, and one real IPython kernel for
notebook tests. Each tier's folder (unit/, integration/, notebook/, browser/) has a conftest
that marks its tests with the tier's name (tests/README.md)."""

from __future__ import annotations

import sys
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
