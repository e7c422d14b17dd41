"""swift_nb.import_trace and `swift-nb import`: torch.profiler traces recorded elsewhere
(real CUDA/NCCL traces in tests/data/gpu, and CPU traces torch.profiler writes here) become
ordinary run folders."""

from __future__ import annotations

from support.imported_traces import JOB, NCCL_RANK0

from swift_nb import cli
from swift_nb.record import load_run


def test_cli_import(tmp_path, capsys):
    assert cli.main(["import", str(NCCL_RANK0), "-o", str(tmp_path), "--label", "nccl"]) == cli.OK
    out = capsys.readouterr().out
    assert "imported 1 trace(s) as" in out and "verdict: " in out and out.rstrip().endswith("report.html")
    (folder,) = tmp_path.iterdir()
    assert load_run(folder).label == "nccl"
    assert cli.main(["import", str(tmp_path / "missing.json")]) == cli.USAGE
    assert "must be existing trace files" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    assert cli.main(["import", str(bad), "-o", str(tmp_path)]) == cli.FAILED
    assert "bad.json: not JSON" in capsys.readouterr().err


def test_importing_and_reporting_imports_no_torch(tmp_path):
    """A laptop reading a cluster's traces needs no torch: import_trace and its report,
    the report written again and the CLI's list run without importing it."""
    import subprocess
    import sys

    code = (
        "import sys, swift_nb\n"
        f"run = swift_nb.import_trace({[str(p) for p in JOB]!r}, {str(tmp_path)!r})\n"
        "swift_nb.report(run.path)\n"
        "from swift_nb import cli\n"
        f"assert cli.main(['list', {str(tmp_path)!r}]) == 0\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr
