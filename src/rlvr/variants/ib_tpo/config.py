"""IB-TPO's config section ``ib_tpo:`` (``docs/ib_tpo.md`` §3), read by the tree sampler and the ``ib_tree`` estimator.

Pure pydantic (this module sits at the config layer: :mod:`rlvr.config` imports it so that a config with an
``ib_tpo:`` section validates before any part is loaded); importing it registers the section.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlvr.config.sections import StrictModel
from rlvr.registry import register_section


class IBTPOConfig(StrictModel):
    """IB-TPO knobs (``docs/ib_tpo.md`` §3; every mechanic is a named switch).

    ``None`` sizes derive from ``num_generations`` G: ``num_initial_chains`` → round(G ·
    ``initial_chain_frac``), ``branches_per_round`` → max(1, G // 4) (4 at G = 16, 2 at G = 8).
    ``branch_score=attention_fci`` (AttnRL) is not implemented and therefore not accepted.
    """

    num_initial_chains: int | None = Field(None, ge=1)
    initial_chain_frac: float = Field(0.5, gt=0, le=1)
    branches_per_round: int | None = Field(None, ge=1)
    continuations_per_branch: int = Field(1, ge=1)
    max_rounds: int = Field(8, ge=1)
    max_children: int = Field(4, ge=2)
    min_remaining_tokens: int = Field(64, ge=1)
    path_branch_penalty: float = Field(0.1, ge=0)
    leaf_target_factor: float = Field(1.5, gt=0)
    token_budget: Literal["mean_length", "half_max"] = "mean_length"
    allow_root_branch: bool = True
    budget_counts: Literal["decode", "decode_plus_prefill"] = "decode"
    projected_cost: Literal["mean_remaining", "max_remaining"] = "mean_remaining"
    tie_break: Literal["deeper", "shallower", "random"] = "deeper"
    branch_score: Literal["ib", "entropy", "random"] = "ib"
    ib_form: Literal["h_plus_beta_i", "i_minus_beta_h", "i_over_h"] = "h_plus_beta_i"
    ib_beta: float = Field(1.0, ge=0)
    value_est: Literal["recursive", "leaf_mean"] = "recursive"
    step_entropy: Literal["mean_surprisal", "head_surprisal"] = "mean_surprisal"
    head_tokens: int = Field(16, ge=1)
    step_split: Literal["paragraph", "fixed"] = "paragraph"
    step_delimiter: str = "\n\n"
    step_min_tokens: int = Field(16, ge=1)
    step_max_tokens: int = Field(512, ge=1)
    fixed_step_tokens: int = Field(256, ge=1)
    ib_local: Literal["full", "value_only"] = "full"
    ib_lambda: float = Field(0.1, ge=0)
    ib_gate: bool = True
    adv_scale: Literal["leaf_std", "none"] = "leaf_std"
    prefix_weight: Literal["sqrt", "inv", "dedup"] = "sqrt"

    @model_validator(mode="after")
    def _check(self) -> "IBTPOConfig":
        if self.ib_form == "i_over_h" and self.ib_local != "value_only":
            raise ValueError("ib_tpo.ib_form=i_over_h is only allowed with ib_tpo.ib_local=value_only")
        if self.step_min_tokens > self.step_max_tokens:
            raise ValueError(
                f"ib_tpo.step_min_tokens={self.step_min_tokens} exceeds ib_tpo.step_max_tokens={self.step_max_tokens}"
            )
        if not self.step_delimiter:
            raise ValueError("ib_tpo.step_delimiter must be a non-empty string")
        return self


register_section("ib_tpo", IBTPOConfig)
