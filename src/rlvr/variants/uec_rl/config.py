"""UEC-RL's config section ``uec:`` (``docs/uec_rl.md`` §3), read by its sampler, retention filter and schedule.

Pure pydantic (this module sits at the config layer: :mod:`rlvr.config` imports it so that a config with a
``uec:`` section validates before any part is loaded); importing it registers the section.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlvr.config.sections import StrictModel
from rlvr.registry import register_section


class UECConfig(StrictModel):
    """UEC-RL knobs (``docs/uec_rl.md`` §3; defaults: the ``uec_rl_math`` preset, ICR ``UEC-RL`` branch).

    ``None`` sizes derive from the batch geometry: ``update_size`` → ``generation_batch_size`` (N_upd =
    B·G), ``pending_capacity`` → 4·N_upd, ``replay_capacity`` → ``replay_capacity_factor``·N_upd,
    ``replay_min_size`` → N_upd, ``explore_top_p`` → ``top_p``.
    """

    hard_pass_rate_max: float = Field(0.0, ge=0, lt=1)
    explore_num_generations: int = Field(20, ge=0)
    explore_temperature: float = Field(1.1, gt=0)
    explore_top_p: float | None = Field(None, gt=0, le=1)
    explore_adv_grouping: Literal["separate", "pooled"] = "separate"
    explore_logprob_temperature: float = Field(1.0, gt=0)
    explore_is_correction: Literal["none", "tempered_is"] = "none"
    explore_is_max_weight: float = Field(5.0, gt=0)
    regular_adv_floor: float | None = Field(0.05, ge=0)
    explore_filter: Literal["positive", "abs", "none"] = "positive"
    explore_adv_floor: float = Field(0.0, ge=0)
    drop_truncated_positive: bool = True
    accumulate: Literal["pending", "none"] = "pending"
    update_size: int | None = Field(None, ge=1)
    pending_capacity: int | None = Field(None, ge=1)
    replay_admission: Literal["positive", "abs"] = "positive"
    replay_adv_threshold: float = Field(1.0, ge=0)
    replay_capacity: int | None = Field(None, ge=1)
    replay_capacity_factor: float = Field(2.0, gt=0)
    replay_every: int = Field(5, ge=0)
    replay_min_size: int | None = Field(None, ge=1)
    replay_recompute_old_logprob: bool = False
    replay_remove_after_use: bool = False
    probe_rows: int = Field(32, ge=0)
    token_diagnostics: bool = False


register_section("uec", UECConfig)
