"""The ``rewards:`` list of the run config: the reward components summed into each completion's reward
(``docs/rewards.md``).

Pure pydantic at the config layer; :class:`~rlvr.config.RLConfig` holds the list and
:mod:`rlvr.rewards.combine` builds the components from it. Unset (the default), a run's reward is the
task's verifier alone, exactly as before the list existed.

One flat model for the three types (``verifier``, ``reward_model``, ``judge``) rather than a tagged union,
so that an error names the key as written (``rewards[1].batch_siz: unknown key; did you mean
'rewards[1].batch_size'?``); a key another type reads is refused by name.
"""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import Field, model_validator

from rlvr.config.sections import StrictModel

COMMON_KEYS = frozenset({"type", "weight", "name", "sources"})
"""Keys every entry reads."""

LEARNED_KEYS = frozenset({"device", "batch_size", "normalize", "correct_threshold", "failure_score",
                          "batch_timeout_s"})
"""Keys of the learned types (``reward_model``, ``judge``)."""

DEFAULT_BATCH_TIMEOUT_S = 300.0
"""``batch_timeout_s`` of both learned types: the seconds one batch's scoring may take. One value for the
judge and the reward model, so that a step's learned scoring is bounded the same way whichever scores it
(the reasons for 300 s: :class:`rlvr.rewards.reward_model.RewardModelReward`)."""

MODEL_LOAD_KEYS = frozenset({"name_or_path", "revision", "trust_remote_code", "dtype"})
"""Keys of an in-process model (``reward_model``; ``judge`` with ``client: hf``)."""

REWARD_MODEL_KEYS = frozenset({"max_length", "label_index"})
JUDGE_KEYS = frozenset({"client", "rubric", "parse", "score_regex", "json_key", "min_score", "max_score",
                        "cache_size", "max_new_tokens", "include_reference"})
OPENAI_KEYS = frozenset({"base_url", "model", "api_key_env", "timeout_s", "max_retries", "backoff_s",
                         "max_concurrency"})

DEFAULT_RUBRIC = (
    "Grade how well the answer responds to the question: correct, complete and clearly stated. If a "
    "reference answer is given, an answer that disagrees with it is wrong."
)
"""The judge's rubric when ``rubric`` is not set."""

DEFAULT_SCORE_REGEX = r"(?i)score\s*[:=]\s*(-?\d+(?:\.\d+)?)"
"""``parse: regex`` default: ``Score: 7`` / ``score=7.5``, read on the final line of the judge's reply once
its echoes of the graded answer are cut (:func:`rlvr.rewards.judge.parse_score`)."""

NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"


class RewardConfig(StrictModel):
    """One entry of ``rewards:``. The completion's reward is ``Σ weight_c · r_c`` over the entries that
    apply to it (:class:`rlvr.rewards.combine.CombinedScorer`).

    Every type:

    * ``type``: ``verifier`` (the task's own verifier; at most one entry), ``reward_model`` (a
      sequence-classification model's score, :mod:`rlvr.rewards.reward_model`) or ``judge`` (an LLM asked
      with a rubric, :mod:`rlvr.rewards.judge`).
    * ``weight``: the component's factor in the sum (any finite number; 0 logs it without training on it).
    * ``name``: its key in ``reward_components`` and metrics (``rewards/<name>/mean``); default: the task's
      name for the verifier (as without ``rewards:``), else the type.
    * ``sources``: the task-mixture labels it scores (``docs/mixtures.md``); default every row. Rows of
      other sources are not scored by it (no judge call) and get no term.

    Learned types (``reward_model``, ``judge``):

    * ``device``: ``trainer`` (the policy's device, default), ``cpu``, ``cuda`` or ``cuda:N``.
    * ``batch_size``: completions per forward / generate call (≥ 1).
    * ``normalize``: ``none``; ``group`` (z-score within each prompt's group); ``running`` (z-score
      against the running mean / std of every score so far, kept in checkpoints).
    * ``correct_threshold``: a row no verifier scores counts as correct when this component's raw score is
      ≥ it (default: the judge's 0.5 on its [0, 1] scale; a reward model's ``None``: never).
    * ``failure_score``: the raw score of a row this component failed to score: the judge's default 0.0
      (the bottom of its [0, 1] scale); the reward model's default ``batch_min``, the lowest score it gave
      in that batch (its scale is its own, so a fixed value could pay the policy for a failure); a number
      for either.
    * ``batch_timeout_s``: the total seconds one batch's scoring may take (default 300; ``null``: no total
      bound); the rows not scored by then score ``failure_score`` and count in ``<name>/timeouts`` and
      ``<name>/failures``. The judge keeps it over every call, retry and wait; the reward model checks it
      between its mini-batches of ``batch_size`` rows.

    ``reward_model``: ``name_or_path`` (required; ``tiny`` builds a random test classifier), ``revision``,
    ``trust_remote_code`` (e.g. ArmoRM's custom head), ``dtype`` (``auto``: bf16 on CUDA, fp32 on CPU),
    ``max_length`` (tokens of prompt + completion, truncated from the left; capped at the model's own
    limit when it is longer), ``label_index`` (the logit read when the head has several and the model gives
    no ``score``). A mini-batch whose forward raises (a device OOM, a bad input) scores ``failure_score``
    and counts in ``<name>/failures``; the step goes on.

    ``judge``: ``client`` (``openai``: an OpenAI-compatible ``/v1/chat/completions`` server, e.g. ``vllm
    serve``; ``hf``: an in-process causal LM, greedy), ``rubric``, ``parse`` (``regex`` with
    ``score_regex``'s first group, or ``json`` with ``json_key``), ``min_score`` / ``max_score`` (the
    judge's scale, mapped to [0, 1]; a score outside it is a parse failure, scoring ``failure_score`` like
    a failed call), ``cache_size`` (judgements remembered, 0 = none), ``max_new_tokens``,
    ``include_reference`` (show the problem's reference answer). With
    ``client: openai``: ``base_url`` (ending in ``/v1``) and ``model`` (required), ``api_key_env`` (the
    environment variable holding the key; never logged), ``timeout_s`` (per HTTP call), ``max_retries``,
    ``backoff_s`` (first retry's wait, doubling), ``max_concurrency`` (calls in flight). With
    ``client: hf``: ``name_or_path`` (``tiny`` = the random test model), ``revision``,
    ``trust_remote_code``, ``dtype``.
    """

    type: Literal["verifier", "reward_model", "judge"]
    weight: float = 1.0
    name: str | None = Field(None, pattern=NAME_PATTERN)
    sources: list[str] | None = None
    # learned types
    device: str = "trainer"
    batch_size: int = Field(8, ge=1)
    normalize: Literal["none", "group", "running"] = "none"
    correct_threshold: float | None = None
    failure_score: float | Literal["batch_min"] | None = None
    batch_timeout_s: float | None = Field(DEFAULT_BATCH_TIMEOUT_S, gt=0)
    # an in-process model
    name_or_path: str | None = None
    revision: str | None = None
    trust_remote_code: bool = False
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    # reward_model
    max_length: int = Field(1024, ge=8)
    label_index: int = Field(0, ge=0)
    # judge
    client: Literal["openai", "hf"] = "openai"
    rubric: str = DEFAULT_RUBRIC
    parse: Literal["regex", "json"] = "regex"
    score_regex: str = DEFAULT_SCORE_REGEX
    json_key: str = "score"
    min_score: float = 0.0
    max_score: float = 10.0
    cache_size: int = Field(10_000, ge=0)
    max_new_tokens: int = Field(256, ge=1)
    include_reference: bool = True
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    timeout_s: float = Field(60.0, gt=0)
    max_retries: int = Field(2, ge=0)
    backoff_s: float = Field(0.5, ge=0)
    max_concurrency: int = Field(8, ge=1)

    def allowed_keys(self) -> frozenset[str]:
        """The keys this entry's type (and judge client) reads."""
        if self.type == "verifier":
            return COMMON_KEYS
        if self.type == "reward_model":
            return COMMON_KEYS | LEARNED_KEYS | MODEL_LOAD_KEYS | REWARD_MODEL_KEYS
        client = MODEL_LOAD_KEYS if self.client == "hf" else OPENAI_KEYS
        return COMMON_KEYS | LEARNED_KEYS | JUDGE_KEYS | client

    @property
    def resolved_failure_score(self) -> float | str:
        """``failure_score``, or the type's default (judge 0.0, reward model ``batch_min``)."""
        if self.failure_score is not None:
            return self.failure_score
        return "batch_min" if self.type == "reward_model" else 0.0

    @property
    def resolved_threshold(self) -> float | None:
        """``correct_threshold``, or the type's default (judge 0.5, otherwise None)."""
        if self.correct_threshold is not None or "correct_threshold" in self.model_fields_set:
            return self.correct_threshold
        return 0.5 if self.type == "judge" else None

    @model_validator(mode="after")
    def _check(self) -> "RewardConfig":
        kind = self.type if self.type != "judge" else f"judge with client: {self.client}"
        stray = sorted(self.model_fields_set - self.allowed_keys())
        if stray:
            raise ValueError(f"key {', '.join(stray)} is not read by type: {kind} (it reads "
                             f"{', '.join(sorted(self.allowed_keys()))})")
        if self.type == "judge" and self.failure_score == "batch_min":
            raise ValueError("failure_score: batch_min is the reward model's; a judge's failure_score is a number "
                             "on its [0, 1] scale (default 0.0, the bottom)")
        if isinstance(self.failure_score, float) and not math.isfinite(self.failure_score):
            raise ValueError(f"failure_score must be a finite number, got {self.failure_score!r}")
        needs = []
        if self.type == "reward_model" or (self.type == "judge" and self.client == "hf"):
            needs = ["name_or_path"]
        elif self.type == "judge":
            needs = ["base_url", "model"]
        missing = [k for k in needs if not getattr(self, k)]
        if missing:
            raise ValueError(f"type: {kind} needs the key {' and '.join(missing)}")
        if self.device != "trainer" and not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"device must be trainer, cpu, cuda or cuda:N, got {self.device!r}")
        if self.base_url is not None and not re.match(r"https?://", self.base_url):
            raise ValueError(f"base_url must start with http:// or https:// (got {self.base_url!r})")
        if self.base_url is not None:
            _check_url_host(self.base_url)
        if self.type == "judge":
            if not self.min_score < self.max_score:
                raise ValueError(f"min_score={self.min_score} must be < max_score={self.max_score}")
            try:
                groups = re.compile(self.score_regex).groups
            except re.error as exc:
                raise ValueError(f"score_regex {self.score_regex!r} is not a regular expression: {exc}") from None
            if groups < 1:
                raise ValueError(f"score_regex {self.score_regex!r} needs a group (…) around the number")
        if self.sources is not None and not self.sources:
            raise ValueError("sources: [] scores nothing; leave it out to score every row")
        return self

    @property
    def default_name(self) -> str:
        """The name when ``name`` is unset (the verifier's is the task's, resolved by the scorer)."""
        return self.name or self.type


def _check_url_host(url: str) -> None:
    """Refuse a judge ``base_url`` that names no host or an impossible port (``http://``, ``http://:8000/v1``,
    ``http://host:99999/v1``): such a URL passes the scheme check, and without this every judge call of the
    run would fail at run time (scored ``failure_score``) instead of the config being refused up front.

    Raises:
        ValueError: naming the URL and what is wrong with it.
    """
    from urllib.parse import urlsplit

    if any(c.isspace() for c in url):
        raise ValueError(f"base_url {url!r} contains whitespace (expected e.g. http://127.0.0.1:8000/v1)")
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"base_url {url!r} names no host (expected e.g. http://127.0.0.1:8000/v1)")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"base_url {url!r} has an invalid port (expected 1-65535, e.g. "
                         "http://127.0.0.1:8000/v1)")


def check_reward_list(entries: list[RewardConfig], has_mixture: bool) -> None:
    """The list-wide rules of ``rewards:`` (each entry checked itself on validation).

    Raises:
        ValueError: more than one ``verifier`` entry, two entries with the same ``name`` (two learned
            entries of one type need a ``name`` each), every weight 0, or ``sources`` without ``task.mixture``.
    """
    if not entries:
        return
    verifiers = [i for i, e in enumerate(entries) if e.type == "verifier"]
    if len(verifiers) > 1:
        raise ValueError(f"rewards[{verifiers[1]}]: a second verifier entry (the task has one verifier; "
                         "restrict one entry to some sources with sources: [...])")
    seen: dict[str, int] = {}
    for i, e in enumerate(entries):
        if e.type == "verifier" and e.name is None:
            continue  # the task's name: checked against the others by the scorer
        if e.default_name in seen:
            raise ValueError(f"rewards[{i}] and rewards[{seen[e.default_name]}] are both named "
                             f"{e.default_name!r}: give rewards[{i}] a name: ...")
        seen[e.default_name] = i
    if not any(e.weight != 0 for e in entries):
        raise ValueError("rewards: every weight is 0, so every completion's reward would be 0")
    for i, e in enumerate(entries):
        if e.sources is not None and not has_mixture:
            raise ValueError(f"rewards[{i}].sources names task-mixture sources, but task.mixture is not set")


__all__ = ["DEFAULT_BATCH_TIMEOUT_S", "DEFAULT_RUBRIC", "DEFAULT_SCORE_REGEX", "RewardConfig",
           "check_reward_list"]
