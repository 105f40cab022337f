"""μ-GRPO's config section ``mu_grpo:`` (``docs/mu_grpo.md`` §3), read by the staged schedule and the veto mask.

Pure pydantic (this module sits at the config layer: :mod:`rlvr.config` imports it so that a config with a
``mu_grpo:`` section validates before any part is loaded); importing it registers the section.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlvr.config.sections import StrictModel
from rlvr.registry import register_section


class MuGRPOConfig(StrictModel):
    """μ-GRPO (``docs/mu_grpo.md`` §3): the staged schedule's knobs and the negative-advantage veto.

    μ itself is ``steps_per_generation`` (alias ``mu_grpo.mu``); the relaxed clip window is plain
    ``epsilon=1.0, epsilon_high=4.0``. The veto acts when the ``veto`` mask is listed in
    ``loss_masks``; the staged schedule when ``schedule: staged``.
    """

    veto_ratio_threshold: float = Field(1e-4, gt=0, le=1)
    veto_scope: Literal["suffix", "nontrigger_suffix", "sequence", "trigger_only", "none"] = "suffix"
    veto_denominator: Literal["drop", "keep"] = "drop"
    veto_trigger: Literal["token", "prefix"] = "token"  # prefix: interpretation, see rlvr.core.veto
    reset_optimizer_each_stage: bool = False
    shuffle_groups_within_stage: bool = True
    stage_prompt_draw: Literal["continue_loader", "fresh_shuffle"] = "continue_loader"


register_section("mu_grpo", MuGRPOConfig)
