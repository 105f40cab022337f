"""``python -m rlvr`` — the command line (so that ``torchrun --nproc_per_node N -m rlvr train ...`` works)."""

import sys

from rlvr.cli import main

if __name__ == "__main__":
    sys.exit(main())
