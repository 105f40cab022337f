"""Side-by-side comparison of algorithms under an equal budget (``rlvr compare``).

:func:`run_compare` runs arms (recipe + overrides) × seeds, resumably; :func:`write_report`
renders the Markdown table and PNG curves. See ``docs/testbed.md``.
"""

from rlvr.compare.harness import run_compare, run_one
from rlvr.compare.spec import Arm, CompareSpec
from rlvr.compare.budget import Budget, BudgetExhausted, BudgetMeter
from rlvr.compare.report import write_report

__all__ = ["Arm", "Budget", "BudgetExhausted", "BudgetMeter", "CompareSpec", "run_compare", "run_one", "write_report"]
