"""Out of memory: a real allocation failure under RLIMIT_AS in a child process, saved as
status ``oom`` with what was live, where it failed and what would make it fit; the
post-mortem's parts on their own; the cell's traceback unchanged in a kernel."""

from __future__ import annotations

import re

from support.oom import _text


def test_a_failing_cell_keeps_its_traceback_and_shows_the_post_mortem(kernel, tmp_path):
    res = kernel.execute(
        f"%%swift_profile --out {tmp_path}\n"
        "m = train(3)\n"
        "raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 64.00 MiB.')"
    )
    assert res.status == "error"
    (err,) = res.of_type("error")
    assert err["ename"] == "OutOfMemoryError"
    tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(err["traceback"]))
    assert "swift_nb" not in tb and "Tried to allocate 64.00 MiB" in tb
    shown = _text("".join(d["data"].get("text/html", "") for d in res.of_type("display_data")))
    assert "Out of memory in step 3, forward, asking for 64.0 MiB" in shown
