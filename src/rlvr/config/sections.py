"""The sections of the configuration tree (``model``, ``task``, ``logging``, ``eval``, the sampling
switches, ``distributed``, ``vllm`` and ``env``).

Each is a strict pydantic model (unknown keys are errors). :mod:`rlvr.config` assembles them into
:class:`~rlvr.config.RLConfig` and re-exports every class here. The variants' sections (``mu_grpo``,
``uec``, ``ib_tpo``, ``fbos``) live in their folders, ``rlvr/variants/<name>/config.py``: like ``env``
they are not fields of ``RLConfig`` but registered sections (:data:`rlvr.registry.CONFIG_SECTIONS`),
declared at the config layer (:mod:`rlvr.config` imports those modules) so that a config builds
without importing the variants' parts, which declare the same models when they register, the way a
plugin's part declares its own.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rlvr.config.mixture import CurriculumConfig
from rlvr.registry import register_section


DEFAULT_EVAL_SIZE = 100
"""Eval problems generated (reasoning-gym, testbed) or held out of ``task.path`` when ``task.eval_size`` is unset."""


class StrictModel(BaseModel):
    """Base of every config section: unknown keys, NaN/inf and booleans for numbers are refused.

    Subclass it for a plugin's own section (registered with :func:`rlvr.registry.register_section`).
    """

    # allow_inf_nan=False: a NaN or infinite number is never a meaningful knob value (`entropy_coef=nan`
    # used to pass validation and crash in the loss after the model loaded; `learning_rate=inf` trained
    # on non-finite weights); every "no limit" knob has its own spelling (0 or null)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=(), allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, v: Any, info: Any) -> Any:
        """Refuse a boolean for a number-only key (pydantic's lax mode reads ``true`` as 1: ``max_steps:
        yes`` used to train 1 step and ``learning_rate=true`` at 1.0; YAML 1.1 reads yes/no/on/off as
        booleans). Interpretation (issue 25, "values of the wrong type that YAML coerces")."""
        if isinstance(v, bool) and _numeric_only(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"expected a number, got the boolean {str(v).lower()} (YAML reads true/false, "
                             "yes/no and on/off as booleans)")
        return v


def _numeric_only(annotation: Any) -> bool:
    """Whether a field's type admits numbers but not booleans (``int``, ``float | None``, ...)."""
    import typing

    seen: set[Any] = set()

    def walk(t: Any) -> None:
        if t in seen:
            return
        seen.add(t)
        for a in typing.get_args(t):
            walk(a)

    walk(annotation)
    if bool in seen or Any in seen:
        return False
    return bool({int, float} & seen)


LORA_INIT_CHOICES = ("true", "false", "gaussian")


class LoraConfig(StrictModel):
    """LoRA adapters through ``peft`` (``model.lora.*``); ``r = 0`` (the default) trains every weight.

    Field names and meanings are peft's ``LoraConfig`` (Hu et al. 2021, "LoRA", §4.1: the update of a
    weight ``W`` is ``(alpha / r) · B A`` with ``A`` ``[r, in]``, ``B`` ``[out, r]``):

    * ``r``: adapter rank (0 = off).
    * ``alpha``: scaling numerator (``lora_alpha``); the update is scaled by ``alpha / r``.
    * ``dropout``: dropout on the adapter's input (``lora_dropout``), in ``[0, 1)``.
    * ``target_modules``: module-name suffixes to adapt (a list, or one comma-separated string), or ``"all-linear"`` (the default): every
      ``nn.Linear`` of the decoder blocks, never the LM head (peft's own meaning of ``all-linear``).
    * ``init_lora_weights``: ``true`` (peft's default: Kaiming-uniform ``A``, zero ``B``, so the
      adapted model starts equal to the base), ``gaussian`` (normal ``A``, zero ``B``) or ``false``
      (random ``B`` too: the start differs from the base; for tests). Initialisations that rewrite the
      base weights (PiSSA, OLoRA, LoftQ) are refused: the reference policy is the base model with
      adapters disabled, and base weights must stay the original ones.
    * ``merged_generation``: the engine samples from a separate copy of the model whose adapted
      weights are ``W + (alpha/r) B A``, refreshed from the unchanged base weights after every update
      (default; measured faster on CPU, ``benchmarks/bench_lora.py``), or — ``false`` — through the
      peft layers themselves (no copy of the adapted weights; slower per decode step).
    """

    r: int = Field(0, ge=0)
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    init_lora_weights: bool | Literal["gaussian"] = True
    merged_generation: bool = True

    @model_validator(mode="before")
    @classmethod
    def _refuse_base_rewriting_init(cls, data: Any) -> Any:
        if isinstance(data, dict):
            init = data.get("init_lora_weights")
            if isinstance(init, str) and init.lower() not in LORA_INIT_CHOICES:
                raise ValueError(
                    f"init_lora_weights {init!r} is not supported; use true, false or gaussian "
                    "(initialisations that rewrite the base weights, such as pissa, olora or loftq, would make "
                    "the adapter-disabled reference policy differ from the original model)"
                )
            if isinstance(init, str) and init.lower() in ("true", "false"):
                data = {**data, "init_lora_weights": init.lower() == "true"}
            tm = data.get("target_modules")
            if isinstance(tm, str) and tm != "all-linear":  # "q_proj,v_proj" from the command line
                data = {**data, "target_modules": [x.strip() for x in tm.split(",")]}
        return data

    @model_validator(mode="after")
    def _check(self) -> "LoraConfig":
        if isinstance(self.target_modules, list):
            if not self.target_modules:
                raise ValueError("target_modules: an empty list adapts nothing; give module names "
                                 "(e.g. [q_proj, v_proj]) or all-linear")
            bad = [m for m in self.target_modules if not isinstance(m, str) or not m.strip()]
            if bad:
                raise ValueError(f"target_modules: empty module name in {self.target_modules}")
            if "lm_head" in self.target_modules:
                raise ValueError("target_modules: lm_head cannot be adapted (the chunked log-prob "
                                 "path reads the head's weight directly); adapt decoder projections only")
        return self


class ModelConfig(StrictModel):
    """Which policy to load. ``name_or_path``: ``default`` (embedded SmolLM2-135M-Instruct), a local
    folder, a ``.gguf`` file, or a Hugging Face id (the only case that touches the network).

    ``dtype`` is the precision policy (:mod:`rlvr.precision`): ``auto`` (bf16 autocast where bf16 is
    native, else fp32), ``fp32``, ``bf16`` (autocast, fp32 master weights), ``bf16-pure`` (bf16 weights),
    ``bf16-master`` (bf16 weights, fp32 masters and gradient accumulation in the optimizer; one process only:
    :mod:`rlvr.trainer.master_weights`) or ``fp16-pure``; the older ``float32`` / ``bfloat16`` / ``float16`` mean ``fp32`` / ``bf16-pure`` /
    ``fp16-pure``. ``lora``: train LoRA adapters instead of every weight (:class:`LoraConfig`).

    Engine/trainer agreement under bf16 (``docs/precision.md``, ``benchmarks/logprob_agreement.py``):
    ``cast_lm_head_to_fp32`` (TRL's ``GRPOConfig`` name; the top-level key is accepted as an alias) runs the LM
    head's matmul in float32 in the trainer's log-softmax and in the HF engine's next-token logits;
    ``generation_autocast`` makes the HF engine decode from the fp32 master weights under the trainer's
    autocast instead of from a bf16 copy (``dtype=bf16`` only). Both off by default; together they halve the
    median per-token |Δ log p| between the engine and the trainer on SmolLM2-135M (docs/precision.md). The
    vLLM engine ignores both (its logits are in its served dtype).

    ``attention_fp32`` runs attention (scores, softmax, weighted sum and their backward) in float32 under a
    bf16 policy, every other matmul staying bf16 (:mod:`rlvr.models.attention`; off by default: whether it is
    faster depends on the CPU, ``benchmarks/bench_update_dtype.py`` arm ``bf16-master+attn32``). HF engine and
    trainer both follow it; a no-op under fp32."""

    name_or_path: str = "default"
    gguf_file: str | None = None
    cache_dir: str | None = None
    dtype: Literal["auto", "fp32", "bf16", "bf16-pure", "bf16-master", "fp16-pure"] = "auto"
    revision: str | None = None
    gradient_checkpointing: bool = False
    cast_lm_head_to_fp32: bool = False
    generation_autocast: bool = False
    attention_fp32: bool = False
    lora: LoraConfig = Field(default_factory=LoraConfig)

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype_alias(cls, v: Any) -> Any:
        aliases = {"float32": "fp32", "bfloat16": "bf16-pure", "float16": "fp16-pure", "fp16": "fp16-pure"}
        return aliases.get(v.strip().lower(), v.strip().lower()) if isinstance(v, str) else v


class TaskConfig(StrictModel):
    """Where prompts come from and how completions are verified (``rlvr.tasks``).

    ``eval_size``: for an eval split read from a file or dataset split (``eval_path``,
    ``eval_split``), ``None`` (default) keeps every row in file order and N keeps the first N; for a
    split held out of ``path`` or generated (reasoning-gym, testbed) it is the split's size,
    ``None`` meaning :data:`DEFAULT_EVAL_SIZE`.
    """

    type: Literal["reasoning_gym", "jsonl", "hf_dataset", "testbed", "code"] = "reasoning_gym"
    name: str = "chain_sum"
    config: dict[str, Any] = Field(default_factory=dict)
    path: str | None = None
    eval_path: str | None = None
    hf_config: str | None = None
    train_split: str = "train"
    eval_split: str = "test"
    question_field: str = "question"
    answer_field: str = "answer"
    train_size: int = Field(1000, ge=1)
    eval_size: int | None = Field(None, ge=1)
    seed: int = 0
    eval_seed: int = 10_000
    system_prompt: str | None = None
    reward_fn: str | None = None
    feedback_hint: bool = False
    correct_threshold: float = 1.0
    mixture: list["MixtureSourceConfig"] | None = None
    curriculum: CurriculumConfig | None = None

    @property
    def eval_size_or_default(self) -> int:
        """``eval_size``, or :data:`DEFAULT_EVAL_SIZE` when unset (generated and held-out splits)."""
        return self.eval_size if self.eval_size is not None else DEFAULT_EVAL_SIZE

    @model_validator(mode="after")
    def _check(self) -> "TaskConfig":
        if self.type == "reasoning_gym" and self.seed == self.eval_seed:
            raise ValueError(
                f"task.seed and task.eval_seed are both {self.seed}: train and eval splits must use "
                "different seeds so they stay disjoint"
            )
        if self.type == "jsonl" and not self.path and not self.eval_path:
            raise ValueError("task.path is required when task.type=jsonl (a JSONL file with question/answer); "
                             "for evaluation only, task.eval_path alone is enough")
        if self.reward_fn is not None and ":" not in self.reward_fn:
            raise ValueError(f"task.reward_fn must look like 'module:function', got {self.reward_fn!r}")
        if "weight" in type(self).model_fields and (self.mixture is not None or self.curriculum is not None):
            raise ValueError("a mixture entry cannot hold its own mixture or curriculum (put them at task.*)")
        if self.mixture is not None:
            self._check_mixture()
        elif self.curriculum is not None:
            raise ValueError("task.curriculum is read only with task.mixture (the weights of its sources)")
        return self

    def _check_mixture(self) -> None:
        """A mixture's top level holds only ``mixture``, ``curriculum`` and ``system_prompt`` (the entries'
        default); any other key set to a non-default value would be silently unread, so it is refused."""
        if not self.mixture:
            raise ValueError("task.mixture needs at least one entry ({type, name, ..., weight})")
        defaults = TaskConfig.model_fields
        stray = sorted(k for k in self.model_fields_set - {"mixture", "curriculum", "system_prompt"}
                       if k in defaults and getattr(self, k) != defaults[k].get_default(call_default_factory=True))
        if stray:
            raise ValueError(f"task.{', task.'.join(stray)} set beside task.mixture: with a mixture each entry is a "
                             "full task section of its own; move these keys into the entries. If you did not set "
                             "them, a recipe or file given before yours did (e.g. testbed, demo): a later file "
                             "cannot unset keys, so layer the mixture on a recipe without a task section (grpo, "
                             "dapo, ...) and copy the other keys you need (model.name_or_path, lengths, batch "
                             "sizes) into your file")
        if self.curriculum is None or self.curriculum.weights_by_step is None:
            if not sum(e.weight for e in self.mixture) > 0:
                raise ValueError("task.mixture: at least one entry needs weight > 0")


class MixtureSourceConfig(TaskConfig):
    """One entry of ``task.mixture``: a full task section (``type``, ``name``, ``path``, ``config``, ...)
    plus ``weight`` (its share of the prompts, ≥ 0; normalised over the entries) and ``label`` (its name in
    metrics and in ``Problem.metadata["source"]``; default: the task's name). See ``docs/mixtures.md``."""

    weight: float = Field(1.0, ge=0)
    label: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$")


TaskConfig.model_rebuild()


class DynamicSamplingConfig(StrictModel):
    """DAPO dynamic sampling (``grpo_core.md`` §9.2).

    ``metric`` is what must vary within a group for it to be kept: ``acc`` (default, the verifier's
    pass/fail, as DAPO and verl's ``filter_groups.metric=acc``), ``score`` (the verifier's score before
    shaping), ``reward`` (the total after the overlong shaping: keeps all-wrong groups of mixed
    lengths) or a reward component's name (see ``rlvr.trainer.rollout.filter_metric``).
    """

    enable: bool = False
    metric: str = "acc"
    max_num_gen_batches: int = Field(10, ge=0)
    on_exhausted: Literal["proceed", "error"] = "proceed"
    keep_excess: bool = False


class StreamingConfig(StrictModel):
    """Streaming rollouts (``docs/streaming.md``, :mod:`rlvr.trainer.streaming`): a producer thread samples
    groups continuously into a buffer and the trainer takes ``prompts_per_generation`` whole groups per
    generation batch, each group carrying the policy version that sampled it and its behaviour log-probs.

    ``enable``: the one switch. ``max_staleness``: the most optimizer updates allowed between the weights
    that sampled a group and those at the start of the generation batch that trains it (AReaL's
    ``max_head_offpolicyness``); the producer waits rather than sample a group that would exceed it, and
    a group found older at take time is dropped (``streaming/dropped_groups``). 0 = synchronous.
    ``chunk_prompts``: prompts (whole groups) per producer ``generate`` call (0, the default: a whole
    generation batch); with ``engine: hf`` a weight update waits for the chunk in flight, so a smaller
    chunk makes that wait shorter and a larger one batches decoding better (on the 2-core CPU a whole
    batch per call was 3x faster per update than one prompt per call: ``docs/streaming.md``).
    ``partial_rollouts`` (``engine: hf``, ``sampler: group``): the producer lets an update through between
    two decode steps of the rows in flight instead of holding the weights for the whole chunk; each token
    records the version it was sampled under (``RolloutBatch.token_version``), its behaviour log-prob is that
    version's (the KV cache is recomputed at the change), and a row's ``policy_version``, what
    ``max_staleness`` and the ``staleness/*`` metrics read, is its oldest token's (:mod:`rlvr.engines.partial`).
    """

    enable: bool = False
    max_staleness: int = Field(1, ge=0)
    chunk_prompts: int = Field(0, ge=0)
    partial_rollouts: bool = False


def check_streaming(cfg: Any) -> None:
    """Refuse ``streaming.enable`` with what the streaming path does not do (``docs/streaming.md``).

    Args:
        cfg: the run config (:class:`rlvr.config.run.RLConfig`).

    Raises:
        ValueError: with ``max_async_level > 0`` (two ways to run ahead), dynamic sampling (its rounds filter
            and refill inside one generation call), ``disable_dropout=false`` with the hf engine (the producer
            decodes the module while the trainer runs it in train mode), a ``chunk_prompts`` that does not
            divide ``prompts_per_generation``; ``partial_rollouts`` without ``streaming.enable``, with
            ``engine: vllm`` (the server decodes its own copy: a request would have to be aborted and resumed)
            or with a sampler other than ``group`` (only it carries per-token versions into the batch).
    """
    st = cfg.streaming
    if st.partial_rollouts and not st.enable:
        raise ValueError("streaming.partial_rollouts needs streaming.enable=true (it changes how the streaming "
                         "producer holds the weights)")
    if not st.enable:
        return
    if cfg.max_async_level > 0:
        raise ValueError(f"streaming.enable with max_async_level={cfg.max_async_level}: choose one (streaming "
                         "bounds how far generation runs ahead with streaming.max_staleness)")
    if cfg.dynamic_sampling.enable:
        raise ValueError("streaming.enable with dynamic_sampling.enable is not supported: the producer puts every "
                         "complete group in the buffer (filter groups with batch_filters instead)")
    if cfg.engine == "hf" and not cfg.disable_dropout:
        raise ValueError("streaming.enable with engine=hf needs disable_dropout=true: the producer thread decodes "
                         "the module the trainer runs in train mode, so dropout would reach the samples")
    if st.chunk_prompts and cfg.prompts_per_generation % st.chunk_prompts:
        raise ValueError(f"streaming.chunk_prompts={st.chunk_prompts} must divide the prompts per generation "
                         f"batch ({cfg.prompts_per_generation} = generation_batch_size / num_generations)")
    if st.partial_rollouts and cfg.engine != "hf":
        raise ValueError(f"streaming.partial_rollouts needs engine=hf, got engine={cfg.engine}: a vLLM server "
                         "decodes its own copy of the weights (requests are re-synced between chunks), and "
                         "interrupting and resuming its requests is not built")
    if st.partial_rollouts and cfg.sampler != "group":
        raise ValueError(f"streaming.partial_rollouts needs sampler=group, got sampler={cfg.sampler!r}: only the "
                         "group sampler carries the engine's per-token versions into the batch")


class LoggingConfig(StrictModel):
    """Where and how often the run reports.

    ``report_to``: where step scalars go besides ``metrics.jsonl`` — any of ``tensorboard`` (default),
    ``wandb``, ``mlflow`` (optional extras: ``pip install 'rlvr[wandb]'`` / ``'rlvr[mlflow]'``); see
    :mod:`rlvr.loggers`. ``logging.tensorboard=false`` drops ``tensorboard`` from it (older switch).
    ``run_name`` names the W&B / MLflow run (default: the output folder's name);
    ``mlflow_tracking_uri`` default: ``MLFLOW_TRACKING_URI`` or ``file:OUTPUT_DIR/mlruns``.
    """

    output_dir: str = "runs/rlvr"
    logging_steps: int = Field(1, ge=1)
    log_completions_steps: int = Field(10, ge=0)
    num_completions_to_print: int = Field(2, ge=0)
    tensorboard: bool = True
    progress: bool = True
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(default_factory=lambda: ["tensorboard"])
    run_name: str | None = None
    wandb_project: str = "rlvr"
    wandb_entity: str | None = None
    mlflow_tracking_uri: str | None = None
    mlflow_experiment: str = "rlvr"

    @model_validator(mode="after")
    def _check_report_to(self) -> "LoggingConfig":
        dup = sorted({x for x in self.report_to if self.report_to.count(x) > 1})
        if dup:
            raise ValueError(f"logging.report_to lists {dup} more than once")
        return self

    @property
    def sinks(self) -> list[str]:
        """``report_to`` without ``tensorboard`` when ``logging.tensorboard`` is false (the older switch)."""
        return [x for x in self.report_to if x != "tensorboard" or self.tensorboard]


class DistributedConfig(StrictModel):
    """Many processes (``torchrun``): ``docs/usage.md`` "Many processes and machines", ``rlvr.distributed``.

    ``fsdp``: shard the policy (and the reference model) with FSDP2 — ``null``/``auto`` (default) shards
    when the world size is > 1; ``false`` replicates the model and all-reduces gradients (DDP's
    arithmetic). ``backend``: ``auto`` (nccl on CUDA, gloo on CPU). ``timeout_s``: collective timeout (a
    dead rank fails the others within it). ``num_threads``: CPU intra-op threads per process, 0 = auto
    (``OMP_NUM_THREADS``, else cores ÷ processes per machine); ``rlvr eval`` uses it too (one process:
    0 = ``OMP_NUM_THREADS``, else all cores; 1 avoids OpenMP stalls on a shared machine). FSDP2's mixed precision follows
    ``model.dtype`` (:func:`rlvr.distributed.fsdp.mixed_precision_for`). ``generation_weights`` (FSDP2 only):
    ``copy`` generates with a full copy synced from the shards before each round; ``gathered`` gathers
    the shards for the round and generates on the FSDP module itself (no copy at rest).
    """

    fsdp: bool | None = None
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    timeout_s: float = Field(600.0, gt=0)
    num_threads: int = Field(0, ge=0)
    generation_weights: Literal["copy", "gathered"] = "copy"

    @model_validator(mode="before")
    @classmethod
    def _auto(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("fsdp"), str) and data["fsdp"].lower() in ("auto", "null", "none"):
            data = {**data, "fsdp": None}
        return data


class EvalConfig(StrictModel):
    """Held-out evaluation (``rlvr eval``, ``docs/evaluation.md``).

    ``num_samples`` completions per problem at ``temperature`` (0 = greedy: one completion per
    problem, since more would be identical, and only k = 1 is reported); ``ks``: the k of pass@k and
    maj@k, each in ``[1, num_samples]``; ``batch_size``: sequences decoded together (one engine call
    of ``batch_size // samples`` problems; the default engine decodes them as one batch).
    """

    num_samples: int = Field(16, ge=1)
    ks: list[int] = Field(default_factory=lambda: [1, 4, 16])
    temperature: float = Field(1.0, ge=0)
    batch_size: int = Field(64, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _default_ks(cls, data: Any) -> Any:
        """Unset ``ks``: those of 1, 4, 16 that ``num_samples`` allows (``eval.num_samples=4`` → [1, 4])."""
        if isinstance(data, dict) and "ks" not in data and "num_samples" in data:
            try:
                n = int(data["num_samples"])
            except (TypeError, ValueError):
                return data  # the field validator reports it
            data = {**data, "ks": [k for k in (1, 4, 16) if k <= n] or [1]}
        return data

    @model_validator(mode="after")
    def _check_ks(self) -> "EvalConfig":
        if not self.ks:
            raise ValueError("eval.ks must list at least one k (e.g. [1])")
        bad = [k for k in self.ks if k < 1]
        if bad:
            raise ValueError(f"eval.ks={self.ks}: every k must be >= 1 (got {bad})")
        if self.temperature > 0 and max(self.ks) > self.num_samples:
            raise ValueError(
                f"eval.ks={self.ks} has k={max(self.ks)} > eval.num_samples={self.num_samples}: pass@k and maj@k "
                f"need at least k samples per problem (raise eval.num_samples or drop that k)"
            )
        return self


class VLLMConfig(StrictModel):
    """The vLLM server engine (``engine: vllm``; ``rlvr.engines.vllm_engine``, docs/vllm.md).

    rlvr starts the server itself (``python`` = the vLLM environment's interpreter, built by
    ``make vllm-env``; ``port`` 0 = any free port; ``args`` appended to the server's command line) and
    stops it on exit, Ctrl-C or crash — or, with ``url`` set, connects to a running one (started with
    ``VLLM_SERVER_DEV_MODE=1`` and ``--logprobs-mode processed_logprobs``; it must read
    ``sync_dir``). ``dtype`` ``auto`` follows ``model.dtype``. ``max_model_len`` ``None`` = the
    model's own limit. ``cpu_kv_cache_gib``: the CPU backend's KV cache size (``VLLM_CPU_KVCACHE_SPACE``;
without it vLLM reserves ~92 % of the machine's memory). ``seed_requests``: send each request a seed
(reproducible draws) — off by default because vLLM 0.32's CPU worker crashes ("CPU Generator does not
use offset") when a seeded request's prefill is split across scheduler steps, which long or many
prompts cause; the server itself is started with ``--seed`` = the run seed. ``weight_sync: filesystem`` writes safetensors to ``sync_dir`` (``None``: a
    fresh temporary folder) and reloads them after each round's
    optimizer steps; ``none`` never pushes (a frozen policy, e.g. evaluation).
    """

    url: str | None = None
    python: str = ".venv-vllm/bin/python"
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cpu_kv_cache_gib: float = Field(2.0, gt=0)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    enforce_eager: bool = False
    max_model_len: int | None = Field(None, ge=1)
    startup_timeout_s: float = Field(600.0, gt=0)
    request_timeout_s: float = Field(3600.0, gt=0)
    max_concurrency: int = Field(256, ge=1)
    seed_requests: bool = False
    weight_sync: Literal["filesystem", "none"] = "filesystem"
    sync_dir: str | None = None
    served_model_name: str = "rlvr-policy"
    log_file: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "VLLMConfig":
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"vllm.url must start with http:// or https://, got {self.url!r}")
        return self


class EnvConfig(StrictModel):
    """A multi-turn environment (``env:``; :mod:`rlvr.envs`, docs/environments.md); off when ``type`` is unset.

    ``type``: a built-in name (``single``, ``feedback``, ``tools``) or ``"my_module:MyEnv"`` (importable,
    or in the working directory); setting it makes ``sampler: group`` run episodes
    (:mod:`rlvr.samplers.multiturn`). ``max_turns``: model turns per episode. ``max_tokens``: token
    budget per trajectory after the prompt, model and environment tokens together (``None`` =
    ``max_turns × max_completion_length``; each model turn is still capped by ``max_completion_length``).
    ``timeout_s``: wall clock per episode (0 = none). Every other key is a keyword argument of the
    environment's class (e.g. ``max_retries`` for ``feedback``, ``tools`` for ``tools``), checked against
    its constructor before any model loads.
    """

    model_config = ConfigDict(extra="allow", validate_assignment=True, protected_namespaces=(), allow_inf_nan=False)

    type: str | None = None
    max_turns: int = Field(4, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    timeout_s: float = Field(60.0, ge=0)


# the environment's section (the variants' sections are registered by rlvr/variants/<name>/config.py)
register_section("env", EnvConfig)
