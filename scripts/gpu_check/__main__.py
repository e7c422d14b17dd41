"""``python scripts/gpu_check OUT_DIR [...]`` (or ``python -m gpu_check`` with scripts/ on the
path): the harness's command line, as each check's child process is started too."""

import sys
from pathlib import Path

if not __package__:  # run as a folder: its parent (scripts/) on the path in its place
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
    sys.path.insert(0, str(_here.parent))

from gpu_check.harness import main

if __name__ == "__main__":
    sys.exit(main())
