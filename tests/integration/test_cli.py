"""The swift-nb command line."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.common import train

import swift_nb
from swift_nb.cli import main


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "swift_nb.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_list_and_show(runs_dir):
    with swift_nb.profile(out_dir=runs_dir, label="cli-run") as run:
        train(3)
    listed = _cli("list", str(runs_dir))
    assert listed.returncode == 0 and "cli-run" in listed.stdout
    shown = _cli("show", str(run.path))
    assert shown.returncode == 0 and "cli-run" in shown.stdout and "steps" in shown.stdout
    (run.path / "report.html").unlink()
    reported = _cli("report", str(run.path))
    assert reported.returncode == 0 and "verdict:" in reported.stdout
    assert (run.path / "report.html").is_file()


def test_help_documents_the_exit_status(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "exit status:" in text and "0  done" in text and "1  could not do what was asked" in text
    assert "2  usage error" in text


def test_show_of_a_non_run_folder_is_a_clear_error(tmp_path):
    res = _cli("show", str(tmp_path))
    assert res.returncode == 2 and "not a swift_nb run folder" in res.stderr


def test_compare_writes_a_self_contained_page(runs_dir, tmp_path):
    paths = []
    for label, steps in (("base", 3), ("more", 4)):
        with swift_nb.profile(out_dir=runs_dir, label=label, wait=0, warmup=1, active=1) as run:
            train(steps)
        paths.append(str(run.path))
    out = tmp_path / "cmp.html"
    res = _cli("compare", *paths, "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert "base" in res.stdout and "more" in res.stdout and "1.00×" in res.stdout
    html = out.read_text()
    assert "<table" in html and html.count("data:image/png;base64,") == 2
    assert "http://" not in html and "https://" not in html.replace("https://ui.perfetto.dev", "")
    missing = _cli("compare", paths[0], str(tmp_path / "nope"))
    assert missing.returncode == 2 and "swift-nb:" in missing.stderr
