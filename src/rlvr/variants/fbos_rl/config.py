"""FBOS-RL's config section ``fbos:`` (``docs/fbos_rl.md`` §3), read by its sampler, estimator and schedule.

Pure pydantic (this module sits at the config layer: :mod:`rlvr.config` imports it so that a config with an
``fbos:`` section validates before any part is loaded); importing it registers the section.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlvr.config.sections import StrictModel
from rlvr.registry import register_section


class FBOSConfig(StrictModel):
    """FBOS-RL knobs (``docs/fbos_rl.md`` §3; every interpretation is a named switch).

    ``initial_rollouts`` is ``G1`` (``None``: ``num_generations // 2``); ``G2 = num_generations − G1``.
    ``fap_max_prompt_length`` ``None`` = ``max_prompt_length + prev_attempt_max_tokens + 256``.
    ``fap_template`` ``None`` = the §2.5 template; a custom one must contain ``{problem}`` and
    ``{attempt}`` and may contain ``{feedback_block}``. ``feedback_fn`` is ``module:function`` called as
    ``fn(question, completion, reference_answer) -> str``. ``combine`` is accepted as an alias of
    ``combine_mode``.
    """

    initial_rollouts: int | None = Field(None, ge=1)
    trigger: Literal["any_fail", "all_fail"] = "any_fail"
    parent_assignment: Literal["round_robin"] = "round_robin"
    fill_mode: Literal["plain", "none"] = "plain"
    feedback_level: Literal["none", "format", "answer_wrong", "gt_hint"] = "answer_wrong"
    feedback_fn: str | None = None
    fap_template: str | None = None
    prev_attempt_max_tokens: int = Field(2048, ge=1)
    fap_max_prompt_length: int | None = Field(None, ge=1)
    epa_filter_meta_refs: bool = False
    meta_ref_patterns: list[str] = Field(
        default_factory=lambda: ["previous attempt", "the feedback", "checker said"]
    )
    epa_offpolicy_weight: Literal["shaping", "trunc_is", "plain"] = "shaping"
    shaping_gamma: float = Field(0.1, gt=0)
    trunc_is_cap: float = Field(2.0, gt=0)
    epa_group: Literal["union", "initial_only"] = "union"
    epa_fb_positive_only: bool = False
    ecc_baseline: Literal["group", "parent"] = "group"
    combine_mode: Literal["alternate", "joint"] = "alternate"
    update_order: Literal["epa_first", "ecc_first"] = "epa_first"
    ecc_weight: float = Field(1.0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> "FBOSConfig":
        import re

        for p in self.meta_ref_patterns:
            try:
                re.compile(p)
            except re.error as exc:
                raise ValueError(f"fbos.meta_ref_patterns: {p!r} is not a valid regular expression ({exc})") from None
        if self.feedback_fn is not None and ":" not in self.feedback_fn:
            raise ValueError(f"fbos.feedback_fn must look like 'module:function', got {self.feedback_fn!r}")
        if self.fap_template is not None and not all(k in self.fap_template for k in ("{problem}", "{attempt}")):
            raise ValueError("fbos.fap_template must contain the placeholders {problem} and {attempt}")
        return self


register_section("fbos", FBOSConfig)
