"""``python -m rlvr.cli``: the same as ``rlvr`` and ``python -m rlvr``."""

import sys

from rlvr.cli import main

sys.exit(main())
