"""``python -m rlvr.precision [--json]``: what ``model.dtype=auto`` picks on this machine (``make demo`` uses it)."""

import sys

from rlvr.precision.policy import main

sys.exit(main())
