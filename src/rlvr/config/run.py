"""The one typed, validated configuration tree, loaded from YAML files plus ``key=value`` overrides.

Trainer knobs use TRL's names, value vocabularies (``adv_estimator``, ``loss_agg_mode``,
``kl_estimator``) use verl's (``docs/grpo.md`` §12). Other frameworks' spellings are accepted as
aliases with a warning. Every problem is reported as a :class:`~rlvr.errors.ConfigError` that names the
key path and what was expected — before any model is loaded.
"""

from __future__ import annotations

import difflib
import math
import warnings
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, create_model, field_validator, model_validator

# The sections live in rlvr.config.sections; rlvr.config re-exports the ones users name.
from rlvr.config.sections import (
    DistributedConfig,
    DynamicSamplingConfig,
    StreamingConfig,
    check_streaming,
    EnvConfig,
    EvalConfig,
    LoggingConfig,
    LoraConfig,
    MixtureSourceConfig,
    ModelConfig,
    TaskConfig,
    VLLMConfig,
    StrictModel,
)
from rlvr.config.aliases import apply_aliases, set_path
from rlvr.config.rewards import RewardConfig, check_reward_list
from rlvr.errors import ConfigError
from rlvr.util.file_kinds import CONFIG_MAX_BYTES, not_regular_file, read_capped
from rlvr.plugins import load_entry_points, load_plugins, plugin_list
from rlvr.registry import CONFIG_SECTIONS

# the built-in variants' sections (each module is pure pydantic and registers its own, so a config with
# a variant's section validates before any part is loaded; rlvr.variants)
import rlvr.variants.mu_grpo.config  # noqa: F401 (mu_grpo)
import rlvr.variants.uec_rl.config  # noqa: F401 (uec)
import rlvr.variants.ib_tpo.config  # noqa: F401 (ib_tpo)
import rlvr.variants.fbos_rl.config  # noqa: F401 (fbos)

RECIPES_DIR = Path(__file__).parents[1] / "recipes"


class RLConfig(StrictModel):
    """The whole run. Batch sizes count completions (TRL semantics, ``grpo_core.md`` §1).

    The parts' own sections (``mu_grpo``, ``uec``, ``ib_tpo``, ``fbos`` and any a plugin declares) are
    not fields of this class: :func:`build_config` validates with :func:`config_model`, a subclass with
    one field per :data:`rlvr.registry.CONFIG_SECTIONS` entry.
    """

    seed: int = 0
    # modules imported before validation (their parts and sections become known; rlvr.plugins)
    plugins: list[str] = Field(default_factory=list)
    max_steps: int = Field(20, ge=1)
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    # batch geometry
    num_generations: int = Field(8, ge=2)
    generation_batch_size: int = Field(64, ge=2)
    steps_per_generation: int = Field(1, ge=1)
    num_iterations: int = Field(1, ge=1)
    per_device_train_batch_size: int = Field(8, ge=1)
    # sampling
    temperature: float = 1.0  # > 0: checked by _check_training_temperature (0 = greedy is eval-only)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    max_prompt_length: int = Field(512, ge=1)
    max_completion_length: int = Field(512, ge=1)
    # optimiser
    learning_rate: float = Field(1e-6, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.999, ge=0, lt=1)
    adam_epsilon: float = Field(1e-8, gt=0)
    max_grad_norm: float | None = Field(1.0, gt=0)
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    # objective
    adv_estimator: str = "grpo"
    scale_rewards: Literal["group", "batch", "none"] = "group"
    adv_eps: float = Field(1e-6, ge=0)
    adv_std_unbiased: bool = True
    policy_loss: str = "clipped"
    epsilon: float = Field(0.2, gt=0, le=1)
    epsilon_high: float | None = Field(None, ge=0)
    clip_ratio_c: float | None = Field(None, gt=1)
    importance_sampling_level: Literal["token", "sequence", "sequence_token"] = "token"
    loss_agg_mode: Literal[
        "token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
    ] = "token-mean"
    seq_denominator: Literal["nonempty", "all"] = "nonempty"
    loss_norm_scope: Literal["global", "micro"] = "global"
    loss_scale_factor: float | None = Field(None, gt=0)
    beta: float = Field(0.0, ge=0)
    kl_estimator: str = "k3"
    kl_in_reward: bool = False
    kl_is_correction: bool = False
    entropy_coef: float = 0.0
    mask_truncated_completions: bool = False
    overlong_buffer_len: int | None = Field(None, ge=1)
    overlong_penalty_factor: float = 1.0
    old_logprob_source: Literal["trainer", "sampler"] = "trainer"
    # rollout/training mismatch correction (TRL's names; rlvr.core.rollout_is): off by default
    vllm_importance_sampling_correction: bool = False
    vllm_importance_sampling_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = (
        "token_truncate"
    )
    vllm_importance_sampling_clip_max: float | None = Field(3.0, gt=0)
    vllm_importance_sampling_clip_min: float | None = Field(None, ge=0)
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)
    # generation backend: "hf" (in-process, shares the trained module) or "vllm" (a server; section vllm)
    engine: Literal["hf", "vllm"] = "hf"
    # HF engine: when rows finish, waiting requests take their slots (rlvr.engines.continuous; rlvr eval too).
    # Greedy results equal the chunked loop's up to float rounding; seeded sampling draws differently. vLLM
    # always batches continuously and ignores it.
    continuous_batching: bool = False
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    # overlap: round k+1 is generated while round k trains; rows are exactly this many rounds stale (0 = off)
    max_async_level: int = Field(0, ge=0)
    # streaming rollouts: a producer thread samples groups into a buffer, each with its policy version (trainer/streaming.py)
    streaming: StreamingConfig = Field(default_factory=StreamingConfig)
    # composable parts (registries in rlvr.parts, rlvr.schedules, rlvr.core; checked by trainer.components)
    sampler: str = "group"
    schedule: str = "on_policy"
    loss_masks: list[str] = Field(default_factory=list)
    batch_filters: list[str] = Field(default_factory=list)
    # the parts' own sections (env, mu_grpo, uec, ib_tpo, fbos, plugins'): rlvr.registry.CONFIG_SECTIONS, config_model()
    # run-time robustness and I/O
    save_steps: int = Field(0, ge=0)
    save_total_limit: int | None = Field(None, ge=1)  # keep the newest N checkpoint-* folders (TRL's name)
    max_consecutive_nonfinite: int = Field(5, ge=1)
    max_idle_rounds: int = Field(10, ge=1)  # rounds in a row without an update → checkpoint, exit 3 (Trainer.train)
    reward_errors_fatal: bool = False
    reward_timeout_s: float = Field(30.0, ge=0)  # seconds per reward call, from when a worker takes it; a batch is cut off at 2x; 0 = none
    reward_num_workers: int = Field(1, ge=1)  # verifier worker processes (used when reward_timeout_s > 0 or > 1)
    # reward components summed by weight (rlvr.config.rewards, docs/rewards.md); empty: the verifier alone
    rewards: list[RewardConfig] = Field(default_factory=list)
    logprob_chunk_size: int = Field(1024, ge=1)
    share_prompt_forward: bool = True  # a group's prompt runs once per micro-batch (exact; trainer/forward.py)
    disable_dropout: bool = True  # dropout off in the loss forward too (TRL's name): it sees the network old_logp/sampling saw
    device: Literal["auto", "cpu", "cuda"] = "cpu"  # auto: CUDA when torch sees one (rlvr.distributed.env)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    @field_validator("temperature")
    @classmethod
    def _check_training_temperature(cls, v: float) -> float:
        if v == 0:
            raise ValueError(
                "temperature=0 (greedy decoding) cannot be used for training: GRPO needs sampled groups, and G "
                "greedy completions of a prompt are identical, so every reward in the group is equal and every "
                "advantage is 0 (no learning signal). Use temperature > 0 for training; greedy is for evaluation: "
                "eval.temperature=0"
            )
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"temperature must be a finite number > 0, got {v}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _trl_names(cls, data: Any) -> Any:
        """TRL's ``gradient_accumulation_steps`` and ``num_train_epochs`` (see :func:`resolve_trl_batch_names`)."""
        return resolve_trl_batch_names(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _check_geometry(self) -> "RLConfig":
        g, gbs, spg = self.num_generations, self.generation_batch_size, self.steps_per_generation
        if gbs % g:
            raise ValueError(
                f"generation_batch_size={gbs} completions is not a whole number of groups of "
                f"num_generations={g}: use a multiple of {g} (e.g. {max(g, gbs - gbs % g)})"
            )
        if self.overlong_buffer_len is not None and self.overlong_buffer_len > self.max_completion_length:
            raise ValueError(
                f"overlong_buffer_len={self.overlong_buffer_len} must be ≤ max_completion_length="
                f"{self.max_completion_length} (the soft penalty starts {self.overlong_buffer_len} tokens before the cap)"
            )
        prompts = gbs // g
        if prompts % spg:
            raise ValueError(
                f"generation_batch_size={gbs} = {prompts} prompts × {g} completions cannot be split into "
                f"steps_per_generation={spg} optimizer batches of whole groups: {prompts} prompts is not "
                f"divisible by {spg}"
            )
        if self.kl_is_correction:
            from rlvr.core.kl import check_kl_is_correction  # core is pure math: no import cycle

            try:
                check_kl_is_correction(self.kl_estimator)
            except ValueError as exc:
                raise ValueError(f"kl_is_correction / kl_estimator={self.kl_estimator!r}: {exc}") from None
        if self.importance_sampling_level == "sequence" and self.loss_agg_mode != "seq-mean-token-mean":
            warnings.warn(
                "importance_sampling_level=sequence (GSPO) is meant with loss_agg_mode=seq-mean-token-mean; "
                f"got {self.loss_agg_mode}",
                stacklevel=2,
            )
        if self.vllm_importance_sampling_correction:
            lo, hi = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(
                    f"vllm_importance_sampling_clip_min={lo} > vllm_importance_sampling_clip_max={hi}"
                )
            if self.old_logprob_source == "sampler" and self.steps_per_generation * self.num_iterations > 1:
                raise ValueError(
                    "vllm_importance_sampling_correction with old_logprob_source=sampler: the PPO ratio is "
                    "already taken against the engine's log-probs, so there is no trainer-side old policy to "
                    "correct towards; use old_logprob_source=trainer"
                )
            if self.top_p < 1 or self.top_k > 0:
                warnings.warn(
                    "vllm_importance_sampling_correction with top_p<1 or top_k>0: the engine's log-probs come "
                    "from the truncated distribution, so the correction also reweights the truncation",
                    stacklevel=2,
                )
        if self.max_async_level > 0 and self.vllm_importance_sampling_correction:
            raise ValueError(
                f"vllm_importance_sampling_correction with max_async_level={self.max_async_level}: overlapped rounds "
                "take their old log-probs from the engine, so there is no trainer-side old policy to correct towards"
            )
        if self.engine == "vllm" and self.model.lora.r > 0:
            raise ValueError(
                "engine=vllm with model.lora.r > 0 is not supported: the server is given full weights, not LoRA "
                "adapters (use engine=hf, or merge the adapter first: rlvr export --merge)"
            )
        check_streaming(self)  # streaming's refusals (config/sections.py)
        check_reward_list(self.rewards, self.task.mixture is not None)
        if self.max_async_level > 0 and self.engine != "vllm":
            raise ValueError(
                f"max_async_level={self.max_async_level} needs engine=vllm: the hf engine samples from the very "
                "module being trained, so generation cannot overlap training (use max_async_level=0)"
            )
        if (self.old_logprob_source == "sampler" or self.max_async_level > 0 or self.streaming.enable) and (
                self.top_p < 1 or self.top_k > 0):
            warnings.warn(
                "old_logprob_source=sampler (or max_async_level>0 or streaming, which use the sampler's log-probs) with top_p<1 or top_k>0 biases the importance ratio: the "
                "sampler's log-probs come from a truncated distribution",
                stacklevel=2,
            )
        return self

    @property
    def prompts_per_generation(self) -> int:
        """Prompts drawn per generation round (``generation_batch_size / num_generations``)."""
        return self.generation_batch_size // self.num_generations

    def __reduce__(self):
        """Pickle by value: the class is built per set of sections (:func:`config_model`), so unpickling
        imports the config's ``plugins`` and validates the dump against that process's class."""
        return (_unpickle_config, (self.model_dump(mode="python"),))


def _unpickle_config(data: dict[str, Any]) -> RLConfig:
    load_plugins(data.get("plugins") or [])
    return config_model().model_validate(data)


_MODELS: dict[tuple[tuple[str, type], ...], type[RLConfig]] = {}


def config_model() -> type[RLConfig]:
    """The run-config class for the sections registered now: :class:`RLConfig` plus one field per
    :data:`rlvr.registry.CONFIG_SECTIONS` entry (``name: Model = Model()``), built once per set of
    sections (``pydantic.create_model``), so a section is as strict as a built-in one.

    Raises:
        ConfigError: a registered section's name is already a field of :class:`RLConfig`.
    """
    key = tuple(CONFIG_SECTIONS.items())
    if key not in _MODELS:
        clash = [n for n, _ in key if n in RLConfig.model_fields]
        if clash:
            raise ConfigError(f"config sections {clash} are already keys of RLConfig: a part must declare its "
                              "section under a new top-level name")
        fields: dict[str, Any] = {n: (m, Field(default_factory=m)) for n, m in key}
        _MODELS[key] = create_model("RLConfig", __base__=RLConfig, __module__=__name__, **fields)
    return _MODELS[key]


def _int(v: Any, default: int) -> int | None:
    v = default if v is None else v
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def resolve_trl_batch_names(data: dict[str, Any]) -> dict[str, Any]:
    """Translate TRL's batch-size names where rlvr has the same meaning; refuse them where it has not.

    ``gradient_accumulation_steps`` (TRL: micro-batches per optimizer step): here an optimizer step
    takes ``B = generation_batch_size / steps_per_generation`` completions in micro-batches of
    ``per_device_train_batch_size`` rows, so the same meaning is ``per_device_train_batch_size =
    B / gradient_accumulation_steps`` (set from it when absent, checked when present).
    ``num_train_epochs`` (TRL: passes over the prompt dataset) has no counterpart (a run is
    ``max_steps`` updates) and is not ``num_iterations`` (passes over one generation batch): refused
    with the ``max_steps`` that would give those epochs.

    Args:
        data: the merged raw config mapping (not modified).

    Returns:
        ``data`` without ``gradient_accumulation_steps``, with ``per_device_train_batch_size`` set.

    Raises:
        ValueError: ``num_train_epochs`` given; ``gradient_accumulation_steps`` not an integer ≥ 1,
            not dividing ``B``, or inconsistent with an explicit ``per_device_train_batch_size``.
    """
    gbs, spg = _int(data.get("generation_batch_size"), 64), _int(data.get("steps_per_generation"), 1)
    g, ni = _int(data.get("num_generations"), 8), _int(data.get("num_iterations"), 1)
    if "num_train_epochs" in data:
        epochs = data["num_train_epochs"]
        hint = ""
        task = data.get("task") if isinstance(data.get("task"), dict) else {}
        d = _int(task.get("train_size"), 1000)
        if all(isinstance(x, int) and x > 0 for x in (gbs, spg, g, ni, d)) and isinstance(epochs, (int, float)) \
                and not isinstance(epochs, bool) and epochs > 0 and gbs >= g:
            rounds = -(-int(epochs * d) // (gbs // g))
            hint = (f" Here ({d} training prompts, {gbs // g} per generation round, {spg * ni} updates per round) "
                    f"num_train_epochs={epochs} would be max_steps={rounds * spg * ni}.")
        raise ValueError(
            "num_train_epochs (TRL: passes over the prompt dataset) is not accepted: an rlvr run lasts max_steps "
            "optimizer updates, and num_iterations (passes over each generation batch) means something else. "
            "Set max_steps = epochs × training prompts / (generation_batch_size / num_generations) × "
            "steps_per_generation × num_iterations." + hint
        )
    if "gradient_accumulation_steps" not in data:
        return data
    data = dict(data)
    ga = data.pop("gradient_accumulation_steps")
    if not (isinstance(ga, int) and not isinstance(ga, bool) and ga >= 1):
        raise ValueError(f"gradient_accumulation_steps must be an integer >= 1 (got {ga!r})")
    if gbs is None or spg is None or spg < 1 or gbs % spg:
        return data  # the geometry check reports the batch sizes themselves
    per_update = gbs // spg
    if per_update % ga:
        raise ValueError(
            f"gradient_accumulation_steps={ga} does not divide the {per_update} completions of one optimizer step "
            f"(generation_batch_size={gbs} / steps_per_generation={spg}) into equal micro-batches"
        )
    pd = data.get("per_device_train_batch_size")
    if pd is not None and pd != per_update // ga:
        raise ValueError(
            f"gradient_accumulation_steps={ga} × per_device_train_batch_size={pd} = {ga * pd if isinstance(pd, int) else pd} "
            f"completions per optimizer step, but an optimizer step here takes generation_batch_size / "
            f"steps_per_generation = {gbs} / {spg} = {per_update}: set generation_batch_size={ga * pd * spg if isinstance(pd, int) else '?'}, "
            f"or drop one of the two (per_device_train_batch_size={per_update // ga} matches)"
        )
    data["per_device_train_batch_size"] = per_update // ga
    return data


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds: itself, or inside ``X | None`` / ``list[X]``."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _key_path(loc: tuple[Any, ...]) -> str:
    """``("task", "mixture", 1, "name")`` → ``task.mixture[1].name``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _suggest(model: type[BaseModel], path: tuple[Any, ...], bad: str) -> str:
    cls: Any = model
    for part in path:
        if isinstance(part, int):  # an item of a list of sections (task.mixture[1])
            continue
        field = cls.model_fields.get(part)
        cls = _model_of(getattr(field, "annotation", None))
        if cls is None:
            return ""
    names = list(cls.model_fields)
    close = difflib.get_close_matches(bad, names, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {_key_path((*path, close[0]))!r}?"
    return f"; valid keys here: {', '.join(sorted(names))}"


def format_validation_error(exc: ValidationError, model: type[BaseModel] | None = None) -> str:
    """One line per problem: ``key.path: what was expected (got value)``; an unknown key gets the nearest
    key of ``model`` (default: :func:`config_model`, the run config with the registered sections)."""
    model = model or config_model()
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = _key_path(loc) or "<config>"
        if err["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key{_suggest(model, loc[:-1], str(loc[-1]))}")
            continue
        msg = err["msg"].removeprefix("Value error, ")
        got = err.get("input")
        if err["type"] == "value_error" and not loc:
            lines.append(msg)
        elif isinstance(got, (dict, list)):
            lines.append(f"{key}: {msg}")
        elif err["type"] == "string_type" and isinstance(got, (bool, int, float)):  # YAML read `no`, `1.10` as such
            lines.append(f"{key}: {msg} (got {got!r}: YAML reads an unquoted no/yes/on/off, 1.10 or 007 as a "
                         f"{type(got).__name__}; put the value in quotes)")
        else:
            lines.append(f"{key}: {msg} (got {got!r})")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def parse_override(text: str) -> tuple[str, Any]:
    """``"a.b=value"`` → ``("a.b", parsed value)``; the value is read as YAML (``1e-5``, ``true``, ``[1,2]``).

    Raises:
        ConfigError: no ``=`` or an empty key.
    """
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key=value (e.g. learning_rate=1e-5)")
    key, _, value = text.partition("=")
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        parsed = yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError:
        parsed = value
    if isinstance(parsed, str) and _looks_like_float(parsed):
        parsed = float(parsed)
    return key, parsed


def _looks_like_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return any(c in s.lower() for c in "e.") and s.lower() not in ("inf", "nan", "-inf")


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping holding the same key twice (PyYAML keeps the last
    one silently). Interpretation: a duplicate key in a config is almost always an edit mistake, so
    it is an error naming both lines, as ``yamllint``'s ``key-duplicates`` rule reports it."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # unhashable key: let the base class report it
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}: first on line {first}, again on line {line}",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def safe_load_unique(text: str, where: str | Path) -> Any:
    """Parse YAML ``text`` like ``yaml.safe_load`` but refuse duplicate mapping keys.

    Raises:
        ConfigError: not valid YAML, or a key repeated in one mapping (``where``, the key and both
            line numbers are named).
    """
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.constructor.ConstructorError as exc:
        if exc.problem and exc.problem.startswith("duplicate key"):
            raise ConfigError(f"{where}: {exc.problem}") from None
        raise ConfigError(f"{where}: not valid YAML: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {exc}") from None


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read one YAML mapping; a bare recipe name (``grpo``) is looked up in ``rlvr/recipes/``.

    Raises:
        ConfigError: the file does not exist, is a folder or anything else that is not a regular file
            (a FIFO, ``/dev/zero``), is larger than :data:`~rlvr.util.file_kinds.CONFIG_MAX_BYTES`, is not
            valid YAML (or not UTF-8), repeats a key, or is not a mapping.
    """
    p = _config_path(path)
    if not p.exists():
        known = ", ".join(sorted(x.stem for x in RECIPES_DIR.glob("*.yaml")))
        raise ConfigError(f"config file {str(path)!r} not found (built-in recipes: {known})")
    why = not_regular_file(p)
    if why == "is a directory":
        raise ConfigError(f"config file {str(p)!r} is a directory (expected a YAML file)")
    if why:
        raise ConfigError(f"config file {str(p)!r} {why}: expected a regular YAML file")
    raw = read_capped(p, CONFIG_MAX_BYTES)
    if raw is None:
        raise ConfigError(f"config file {str(p)!r} is larger than {CONFIG_MAX_BYTES // 1024} KiB: not a "
                          "config (rlvr's recipes are a few KiB)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start}): expected a YAML file") from None
    data = safe_load_unique(text, p) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of keys to values, got {type(data).__name__}")
    return data


def _config_path(path: str | Path) -> Path:
    """``path``, or the built-in recipe it names (``grpo`` → ``rlvr/recipes/grpo.yaml``)."""
    p = Path(path)
    if not p.exists() and not p.suffix and (RECIPES_DIR / f"{path}.yaml").exists():
        p = RECIPES_DIR / f"{path}.yaml"
    return p


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def build_config(
    files: list[str | Path] | None = None, overrides: list[str] | None = None, base: dict[str, Any] | None = None,
    plugins: list[str] | tuple[str, ...] = (),
) -> RLConfig:
    """Merge YAML files (later wins), then ``key=value`` overrides, resolve aliases, import the plugins,
    and validate.

    Two passes: the merged mapping's ``plugins`` (every file's and override's list, in order, joined with
    ``plugins``, e.g. the CLI's ``--plugin``) are imported first (:func:`rlvr.plugins.load_plugins`; a
    file entry is looked up from the working directory, then from each config file's folder), and so
    are the ``rlvr.plugins`` entry points of installed packages; then the whole mapping is validated
    against :func:`config_model`, which knows every section those imports declared.

    Raises:
        ConfigError: any unreadable file, a plugin that cannot be imported, unknown key (with the
            nearest valid one), wrong type, out-of-range value, or inconsistent batch geometry.
    """
    raw: dict[str, Any] = dict(base or {})
    names: list[Any] = plugin_list(raw.get("plugins"), "plugins")
    folders: list[Path] = []
    for f in files or []:
        data = apply_aliases(load_yaml(f))
        names += plugin_list(data.get("plugins"), f"{f}: plugins")
        folders.append(_config_path(f).resolve().parent)
        raw = _merge(raw, data)
    for o in overrides or []:
        key, value = parse_override(o)
        data = apply_aliases(_nest(key, value))
        names += plugin_list(data.get("plugins"), "plugins")
        raw = _merge(raw, data)
    names = list(dict.fromkeys([*names, *plugin_list(list(plugins), "--plugin")]))
    load_plugins(names, search=folders)
    load_entry_points()
    if names:
        raw["plugins"] = names
    model = config_model()
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, model)) from None


def _nest(key: str, value: Any) -> dict[str, Any]:
    d: dict[str, Any] = {}
    set_path(d, key, value)
    return d


def config_to_dict(cfg: RLConfig) -> dict[str, Any]:
    """Plain, YAML-serialisable dict of the resolved configuration."""
    return cfg.model_dump(mode="json")
