"""swift_nb.analysis.trace.decode: trace files decoded into the tables without a dict per
event, and decompressed in a stream that stops at a size cap; hostile files (JSON nested past
any decoder's recursion, gzip bombs) are one RecordError naming the file."""

from __future__ import annotations

import subprocess
import sys

from support.trace_decode import write_bomb

from swift_nb.analysis.trace.decode import MAX_STRETCH

# The peak is the process's own (VmHWM, reset by exec): ru_maxrss keeps the high-water
# mark of the process that forked it, and a long test session's pytest is over a GiB.
_PEAK = """
import re, sys
import swift_nb
from swift_nb.analysis.trace.tables import read_trace
from swift_nb.core.errors import RecordError
for read in (read_trace, lambda p: swift_nb.import_trace(p, sys.argv[2], report=False)):
    try:
        read(sys.argv[1])
    except RecordError as e:
        print(e)
with open("/proc/self/status") as f:
    print(int(re.search(r"VmHWM:\\s+(\\d+) kB", f.read()).group(1)) * 1024)
"""


def test_a_2_gib_whitespace_bomb_is_refused_under_1_5_gib_of_memory(tmp_path):
    bomb = write_bomb(tmp_path / "bomb.json.gz", 2048)
    assert bomb.stat().st_size < 4 << 20  # 2 GiB of JSON in ~2 MB, as the bomb in the wild
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, str(bomb), str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    *errors, peak = done.stdout.splitlines()
    assert len(errors) == 2 and all(e.startswith(f"{bomb}: inflates to more than") for e in errors), (
        done.stdout
    )
    assert MAX_STRETCH == 64 << 20
    assert int(peak) < 1.5 * 2**30
