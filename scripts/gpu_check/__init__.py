"""The GPU check: every CUDA path of swift_nb, checked on one GPU; what held is written as JSON.

``bash scripts/gpu_check.sh`` sets up a Python and runs it (``python scripts/gpu_check OUT_DIR``).
``harness`` runs each check in a child process and writes ``gpu_check.json``; ``registry``
lists the checks, one file each under ``checks/``; ``common`` is what they work with."""
