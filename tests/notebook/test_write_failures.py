"""A run that cannot be written at its end (its folder removed while the cell ran, a full
disk) never raises into the user's code after the training has run: the failure is said
once, what was written stays readable, and the measurements are in the returned Run."""

from __future__ import annotations

import errno
import warnings

import torch

import swift_nb
from swift_nb.core.errors import RecordWriteWarning
from swift_nb.record import load_run, write


def _train(steps: int, at_step=None) -> None:
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for k in range(steps):
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
        if at_step is not None:
            at_step(k)


def _said_once(caught) -> str:
    (said,) = [w for w in caught if issubclass(w.category, RecordWriteWarning)]
    return str(said.message)


def test_folder_removed_while_the_cell_runs(tmp_path):
    """The run folder removed after the profiler's window: the trace it held is lost (and
    said so), the rest of the record is written again, nothing is raised."""
    after = []
    prof = swift_nb.profile(out_dir=tmp_path, wait=0, warmup=1, active=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with prof as run:
            # moved away at once (a rename is atomic; rmtree could race the background writer)
            _train(6, lambda k: k == 4 and run.path.rename(tmp_path / "moved"))
        after.append("the user's next line ran")
    assert after == ["the user's next line ran"]
    assert not [w for w in caught if issubclass(w.category, RecordWriteWarning)]
    found = load_run(run.path)
    assert found.status == "ok" and len(found.steps) == 6
    assert any("the profiler trace could not be written" in n for n in found.notes), found.notes
    assert not any("recorded no step" in n for n in found.notes), found.notes


def test_out_folder_replaced_by_a_file(tmp_path):
    """Nothing can be written any more (the folder of runs is gone and a file stands in
    its place): said once, never raised; the measurements are in the returned Run."""
    root = tmp_path / "runs"
    after = []

    def replace_root(k):
        if k == 4:
            # a rename is atomic: rmtree could race the background writer ("Directory not empty")
            root.rename(tmp_path / "moved")
            root.write_text("not a folder")

    prof = swift_nb.profile(out_dir=root, wait=0, warmup=1, active=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with prof as run:
            _train(6, replace_root)
        after.append("the user's next line ran")
    assert after == ["the user's next line ran"]
    said = _said_once(caught)
    assert str(run.path) in said and "the training was not affected" in said
    assert said in run.notes
    assert run.status == "ok" and len(run.steps) == 6  # the measurements, in memory


def test_disk_full_at_the_end(tmp_path, monkeypatch):
    """The disk fills up as the run is saved: run.json stays the readable `running` record
    written when the run started."""
    prof = swift_nb.profile(out_dir=tmp_path, wait=0, warmup=1, active=2)
    real = write.atomic_write_text

    def full(path, text):
        if prof.session._finished:  # from the end of the run on
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, text)

    monkeypatch.setattr(write, "atomic_write_text", full)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with prof as run:
            _train(5)
    said = _said_once(caught)
    assert "No space left on device" in said and str(run.path) in said
    assert len(run.steps) == 5
    monkeypatch.undo()
    found = load_run(run.path)
    assert found.status in ("running", "crashed")  # as written when it started: readable


def test_magic_cell_whose_folder_of_runs_is_replaced(kernel, tmp_path):
    root = tmp_path / "runs"
    res = kernel.execute(
        f"%%swift_profile --out {root} --wait 0 --warmup 1 --active 2\n"
        "import os, pathlib\n"
        "m = train(6)\n"
        # A rename is atomic: rmtree could race the background writer ("Directory not empty").
        f"os.rename({str(root)!r}, {str(tmp_path / 'moved')!r}); "
        f"pathlib.Path({str(root)!r}).write_text('not a folder')\n"
        "print('cell done')"
    )
    assert res.status == "ok", res.outputs
    assert "cell done" in res.text("stdout")
    err = res.text("stderr")
    assert err.count("could not write the run's record") == 1, err
    assert "Traceback" not in res.text()
