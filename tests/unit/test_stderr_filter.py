"""Profiler noise is dropped from fd 2; everything else passes, in order."""

from __future__ import annotations

import os

from swift_nb.capture.stderr_filter import StderrFilter, drop_noise


def test_drop_noise_keeps_user_lines():
    data = (
        b"user 1\n"
        b"USDT:2026-12-02 14:06:56 2079:2079 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
        b"[W1202 14:11:10.5 CPUAllocator.cpp:245] Memory block of unknown size was allocated before the "
        b"profiling started, profiler results will not include the deallocation event\n"
        b"user USDT: mention mid-line\n"
    )
    assert drop_noise(data) == b"user 1\nuser USDT: mention mid-line\n"


def test_filter_routes_a_real_fd_and_restores_it(tmp_path):
    target = tmp_path / "err.txt"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT)
    f = StderrFilter(fd)
    f.start()
    os.write(fd, b"a\nUSDT: noise\nb")
    os.write(fd, b"c\n")
    f.stop()
    os.write(fd, b"after\n")
    os.close(fd)
    assert target.read_bytes() == b"a\nbc\nafter\n"
