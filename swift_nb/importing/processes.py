"""The worker processes an import starts: their start method (forkserver where there is
one, else spawn; never a fork of a process whose torch or CUDA threads may hold locks) and
the caller's script kept from running again in them."""

from __future__ import annotations

import contextlib
import multiprocessing
import sys
from collections.abc import Iterator

#: the module the fork server imports before forking each worker (the pool's, which imports
#: the reduction and the decoders)
POOL = "swift_nb.importing.pool"


def context() -> multiprocessing.context.BaseContext:
    # forkserver (or spawn): a fork of a process that has started torch's or CUDA's threads
    # can deadlock in the child
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    # the server imports the workers' module (and the reduction's) once; each worker forked
    # from it starts with them loaded
    ctx.set_forkserver_preload([POOL])
    return ctx


@contextlib.contextmanager
def main_script_hidden() -> Iterator[None]:
    """While workers start, the caller's script is not named as the main module: spawn and
    forkserver would run it again in each worker (as ``__mp_main__``), and a script that
    calls ``import_trace`` at its top level, without ``if __name__ == "__main__":``, would
    then import again in every worker. The workers need nothing of it."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    try:
        for k in saved:
            setattr(main, k, None)
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)
