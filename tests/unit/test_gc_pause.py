"""swift_nb.core.gc_pause: the collector is off while any thread decodes a trace, back on after
the last one leaves, and never turned on when the program had turned it off."""

from __future__ import annotations

import gc
import threading

import pytest

from swift_nb.core.gc_pause import paused


@pytest.fixture(autouse=True)
def collector_restored():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_pause_nests_and_restores():
    gc.enable()
    with paused():
        assert not gc.isenabled()
        with paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer block still decodes
    assert gc.isenabled()


def test_pause_restores_after_an_error():
    gc.enable()
    with pytest.raises(ValueError), paused():
        raise ValueError("damaged trace")
    assert gc.isenabled()


def test_a_collector_the_program_turned_off_stays_off():
    gc.disable()
    with paused():
        pass
    assert not gc.isenabled()


def test_threads_share_one_pause():
    """The background thread's pause outlives the training thread's: the collector comes
    back only when the last of them leaves."""
    gc.enable()
    inside, leave = threading.Event(), threading.Event()

    def background():
        with paused():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=background)
    t.start()
    assert inside.wait(10)
    with paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # the background thread still holds it
    leave.set()
    t.join(10)
    assert gc.isenabled()
