"""``python -m rlvr``: the same as the ``rlvr`` command (and what ``torchrun --nproc_per_node N -m rlvr
train ...`` runs on every rank)."""

import sys

from rlvr.cli import main

sys.exit(main())
