"""``python scripts/gpu_check.py OUT_DIR [...]``, the GPU check's old path: the package
scripts/gpu_check/ (``python scripts/gpu_check OUT_DIR [...]``) is the check."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/: its package gpu_check/
from gpu_check.harness import main

if __name__ == "__main__":
    sys.exit(main())
