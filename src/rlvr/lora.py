"""LoRA training through ``peft``: wrap the policy, keep a reference policy for free, generate with
the current adapters, save and load adapters, merge for export.

Nothing here implements LoRA layers: :func:`apply_lora` calls ``peft.get_peft_model``, the reference
policy is peft's ``disable_adapter()`` context, the merged weights come from peft's
``LoraLayer.get_delta_weight`` and an export from ``merge_and_unload``.

Layout of a LoRA run's folders (``checkpoint-N/`` and ``final/``): peft's own adapter format
(``adapter_config.json`` + ``adapter_model.safetensors``, loadable with
``PeftModel.from_pretrained(base, folder)``), the tokenizer, and ``rlvr_base_model.json`` — the
``model.*`` settings the base was loaded with, so that ``rlvr eval --checkpoint`` and ``rlvr export``
rebuild the same base. Training checkpoints add the optimizer, scheduler and trainer state as for
full fine-tuning (``rlvr.trainer.checkpoint``).

Generation (:func:`lora_engine`): by default the engine samples from a separate *generation copy*
of the model whose adapted weights are ``W + (alpha/r)·B·A``, recomputed from the never-modified base
weights after each update (no drift from repeated merge/unmerge); the weights it does not adapt
(embeddings, norms, head) are shared with the policy, not copied. ``model.lora.merged_generation=false``
samples through the peft layers instead. The speed of both on CPU is measured by
``benchmarks/bench_lora.py`` (``docs/lora.md``). The sync goes through the engine protocol's
``load_weights`` with base-model names — the same weight-sync point a server engine uses; an engine
that serves LoRA natively (vLLM) can take :func:`adapter_state_dict` instead (adapter-only sync).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from rlvr.errors import ConfigError, ModelLoadError, ModelPathError, OutputDirError

BASE_MODEL_FILE = "rlvr_base_model.json"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_NAME = "default"


def _peft():
    try:
        import peft
    except ImportError as exc:  # pragma: no cover - peft is a core dependency
        raise ConfigError("model.lora.r > 0 needs the peft package: pip install 'peft==0.21.2'") from exc
    return peft


def is_peft_model(model: Any) -> bool:
    """True when ``model`` is a ``peft.PeftModel`` (LoRA adapters attached)."""
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover
        return False
    return isinstance(model, PeftModel)


def base_causal_lm(model: Any) -> Any:
    """The transformers ``*ForCausalLM`` inside a ``PeftModel`` (its LoRA layers included, active
    unless disabled); ``model`` itself when it is not a peft model."""
    return model.get_base_model() if is_peft_model(model) else model


def apply_lora(model: Any, lora_cfg: Any, *, base_model_spec: dict[str, Any] | None = None) -> Any:
    """Wrap a causal LM with LoRA adapters (``peft.get_peft_model``); only the adapters are trainable.

    Args:
        model: a transformers ``*ForCausalLM`` (modified in place: its target ``nn.Linear`` modules
            become peft LoRA layers; every base parameter gets ``requires_grad=False``).
        lora_cfg: :class:`rlvr.config.LoraConfig` with ``r > 0``.
        base_model_spec: the ``model.*`` settings the base came from (``name_or_path`` etc.), kept on
            the wrapper as ``rlvr_base_model`` and written next to every saved adapter.

    Returns:
        the ``peft.PeftModelForCausalLM``. Adapter initialisation draws from torch's global RNG (seed
        first for reproducible runs).

    Raises:
        ConfigError: ``r == 0``, or ``target_modules`` names no module of this model (the message lists
            the linear modules it has).
    """
    if lora_cfg.r <= 0:
        raise ConfigError("apply_lora: model.lora.r must be > 0")
    peft = _peft()
    target = lora_cfg.target_modules
    if target != "all-linear":
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        missing = [t for t in target if not any(n == t or n.endswith("." + t) for n, _ in model.named_modules())]
        if missing:
            raise ConfigError(f"model.lora.target_modules: {missing} match no module of {type(model).__name__}; "
                              f"its linear modules are {linear}")
    pc = peft.LoraConfig(
        r=lora_cfg.r, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout,
        target_modules=target if target == "all-linear" else list(target),
        init_lora_weights=lora_cfg.init_lora_weights, task_type="CAUSAL_LM", bias="none",
    )
    if base_model_spec and base_model_spec.get("name_or_path"):
        pc.base_model_name_or_path = str(base_model_spec["name_or_path"])
    model.requires_grad_(False)
    pm = peft.get_peft_model(model, pc)
    pm.rlvr_base_model = dict(base_model_spec or {})
    return pm


def trainable_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts (elements; tied tensors counted once)."""
    seen: set[int] = set()
    trainable = total = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return trainable, total


@contextlib.contextmanager
def reference_policy(model: Any) -> Iterator[Any]:
    """The base model — the reference policy of a LoRA run — for the duration of the block.

    Inside, ``model`` computes with every adapter disabled (peft's ``disable_adapter()``), i.e. exactly
    the frozen base weights; the adapters are re-enabled on exit, also on error. Yields ``model``.
    Source: interpretation (TRL and verl do the same for LoRA runs: no second model is loaded).

    Raises:
        TypeError: ``model`` is not a peft model.
    """
    if not is_peft_model(model):
        raise TypeError(f"reference_policy needs a peft model, got {type(model).__name__}")
    with model.disable_adapter():
        yield model


def _lora_layers(model: Any) -> Iterator[tuple[str, Any]]:
    from peft.tuners.lora import LoraLayer

    base = base_causal_lm(model)
    for name, mod in base.named_modules():
        if isinstance(mod, LoraLayer):
            yield name, mod


def _merge_into(layer: Any, out: torch.Tensor | None = None) -> torch.Tensor:
    """``W + Σ_adapters ΔW`` of one peft LoRA layer, written into ``out`` (allocated when None).

    For a plain LoRA ``nn.Linear`` (no DoRA, no ``fan_in_fan_out``) ``ΔW = scaling · B A`` is one fused
    ``addmm`` into ``out`` — a single pass over the weight. Any other layer uses peft's own
    ``get_delta_weight``. Both equal peft's merge (tested).
    """
    w = layer.get_base_layer().weight
    adapters = [a for a in layer.active_adapters if a in layer.lora_A]
    plain = (isinstance(layer.get_base_layer(), torch.nn.Linear) and not getattr(layer, "fan_in_fan_out", False)
             and not any(getattr(layer, "use_dora", {}).get(a, False) for a in adapters))
    if out is None:
        out = torch.empty_like(w)
    if plain and adapters:
        a0 = adapters[0]
        torch.addmm(w, layer.lora_B[a0].weight.to(w.dtype), layer.lora_A[a0].weight.to(w.dtype),
                    alpha=float(layer.scaling[a0]), out=out)
        for a in adapters[1:]:
            out.addmm_(layer.lora_B[a].weight.to(w.dtype), layer.lora_A[a].weight.to(w.dtype), alpha=float(layer.scaling[a]))
        return out
    out.copy_(w)
    for a in adapters:
        out.add_(layer.get_delta_weight(a).to(w.dtype))
    return out


def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Merged weights of every adapted module, in base-model names: ``{"<module>.weight": W + ΔW}``.

    ``ΔW = (alpha/r)·B·A`` of the active adapter(s) (peft's merge); ``W`` is the frozen base weight,
    never modified. Shapes are those of the base weights; computed without gradient. This is what a
    full-weight sync sends to an engine (``engine.load_weights``).
    """
    return dict(iter_merged(model))


def iter_merged(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """:func:`merged_state_dict` one tensor at a time (``(name, W + ΔW)``, module order), so a consumer
    that copies each away (``WeightSync.push``) holds one merged weight at a time. Under FSDP2 call it
    inside the gathered context (``DataParallel.inference``): it reads full parameters."""
    for name, layer in _lora_layers(model):
        with torch.no_grad():
            merged = _merge_into(layer)
        yield f"{name}.weight", merged


def adapter_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The adapter tensors only, in peft's saved naming (what ``adapter_model.safetensors`` holds) —
    the payload of an adapter-only weight sync to an engine that serves LoRA itself."""
    return _peft().get_peft_model_state_dict(model)


def generation_copy(model: Any, *, share: bool = True) -> torch.nn.Module:
    """A plain causal LM for sampling: adapted modules become ordinary ``nn.Linear`` with their own
    weight storage.

    Args:
        model: the peft policy (full, unsharded tensors).
        share: every other parameter and buffer is *shared* with ``model`` (frozen, so sharing is safe);
            fill the copy with :func:`merged_state_dict` (or :class:`MergedWeightSync`) before use.
            ``False``: they are copied and the adapted weights are filled with ``W + ΔW`` now — the
            copy owns all its tensors, so it survives ``model`` being sharded afterwards (FSDP2 replaces
            the policy's parameters by shards; the torchrun generation copy,
            :func:`rlvr.distributed.setup.prepare_models`). Costs one full model per process.
    """
    base = base_causal_lm(model)
    layers = dict(_lora_layers(model))
    memo: dict[int, Any] = {}
    if share:
        for p in base.parameters():  # share every base tensor; adapted weights get their own below
            memo[id(p)] = p
        for b in base.buffers():
            memo[id(b)] = b
    else:  # copy everything except the adapted base weights (replaced below, never copied)
        for layer in layers.values():
            memo[id(layer.get_base_layer().weight)] = layer.get_base_layer().weight
    for layer in layers.values():  # the adapter modules are not copied at all
        for sub in (layer.lora_A, layer.lora_B, layer.lora_dropout):
            memo[id(sub)] = torch.nn.ModuleDict()
    import copy

    gen = copy.deepcopy(base, memo)
    for name, layer in layers.items():
        src = layer.get_base_layer()
        lin = torch.nn.Linear(src.in_features, src.out_features, bias=src.bias is not None,
                              device=src.weight.device, dtype=src.weight.dtype)
        lin.weight.requires_grad_(False)
        if src.bias is not None:
            lin.bias = src.bias if share else torch.nn.Parameter(src.bias.detach().clone(), requires_grad=False)
        if not share:
            with torch.no_grad():
                _merge_into(layer, lin.weight.data)
        parent_name, _, child = name.rpartition(".")
        parent = gen.get_submodule(parent_name) if parent_name else gen
        setattr(parent, child, lin)
    gen.eval()  # shared tensors keep their own requires_grad (the frozen base: False)
    if share:
        object.__setattr__(gen, "rlvr_generation_copy_of", base)  # not a submodule: no state_dict entry
    else:
        gen.requires_grad_(False)
    return gen


class MergedWeightSync:
    """Keep a generation copy's adapted weights equal to ``W + ΔW`` of the current adapters.

    Calling the object with the policy's version (the trainer's optimizer-step count) rewrites every
    adapted weight of the engine's model unless that version was pushed last (called without a
    version it always does). When the engine's model is :func:`generation_copy` of ``model`` the merge
    is written straight into its tensors (one fused pass per weight); for any other engine the merged
    weights go through ``engine.load_weights`` (the engine protocol's sync point).

    Args:
        model: the peft policy being trained.
        engine: the generation engine.
    """

    def __init__(self, model: Any, engine: Any) -> None:
        self.model = model
        self.engine = engine
        self._pushed: int | None = None
        self.syncs = 0
        gen = getattr(engine, "model", None)
        self._targets: list[tuple[Any, torch.Tensor]] | None = None
        if getattr(gen, "rlvr_generation_copy_of", None) is base_causal_lm(model):
            params = dict(gen.named_parameters(remove_duplicate=False))
            self._targets = [(layer, params[f"{name}.weight"]) for name, layer in _lora_layers(model)]

    def __call__(self, version: int | None = None) -> bool:
        """Sync if needed; returns True when weights were pushed."""
        if version is not None and version == self._pushed:
            return False
        if self._targets is not None:
            with torch.no_grad():
                for layer, dst in self._targets:  # in place, bumping dst's version (a cast copy re-syncs)
                    _merge_into(layer, dst)
        else:
            self.engine.load_weights(merged_state_dict(self.model))
        self._pushed = version
        self.syncs += 1
        return True


def lora_engine(
    model: Any, tokenizer: Any, *, merged: bool = True, **engine_kw: Any
) -> tuple[Any, Callable[..., bool] | None]:
    """The generation engine of a LoRA run and its weight-sync callable.

    Args:
        model: the peft policy.
        tokenizer: its tokenizer.
        merged: sample from a merged generation copy (synced by the returned callable before each
            generation round) rather than through the peft layers.
        engine_kw: passed to :class:`rlvr.engines.hf.HFEngine`.

    Returns:
        ``(engine, sync)``; ``sync(version)`` (a :class:`MergedWeightSync`, already called once) is None
        when the engine runs the live peft layers (always current).
    """
    from rlvr.engines.hf import HFEngine

    if not merged:
        return HFEngine(base_causal_lm(model), tokenizer, **engine_kw), None
    engine = HFEngine(generation_copy(model), tokenizer, **engine_kw)
    sync = MergedWeightSync(model, engine)
    sync(0)  # version 0: the adapters as they are now (a trainer at step 0 then skips its first push)
    return engine, sync


# ------------------------------------------------------------------------------------------------
# folders: save, load, resume, export


def is_adapter_folder(path: str | Path) -> bool:
    """True when ``path`` holds a peft adapter (``adapter_config.json``)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def write_base_model_spec(model: Any, folder: str | Path) -> None:
    """Write ``rlvr_base_model.json`` (the base's ``model.*`` settings) into a saved adapter folder."""
    spec = getattr(model, "rlvr_base_model", None) or {}
    (Path(folder) / BASE_MODEL_FILE).write_text(json.dumps(spec, indent=2) + "\n")


def load_adapter_weights(model: Any, folder: str | Path) -> None:
    """Load ``folder/adapter_model.safetensors`` into ``model``'s adapters (resume).

    Raises:
        ConfigError: the folder's adapter tensors do not match the model's: other names (listed) or other
            shapes (another base architecture or rank; counted, the first named) (exit 2).
        FileNotFoundError: no adapter weights in ``folder``.
    """
    from safetensors.torch import load_file

    peft = _peft()
    f = Path(folder) / ADAPTER_WEIGHTS
    if not f.is_file():
        raise FileNotFoundError(f"{folder}: no {ADAPTER_WEIGHTS} (not a LoRA checkpoint?)")
    saved = load_file(str(f))
    want_sd = peft.get_peft_model_state_dict(model)
    want = set(want_sd)
    missing, unexpected = sorted(want - set(saved)), sorted(set(saved) - want)
    if missing or unexpected:
        raise ConfigError(f"--resume: the adapter in {folder} does not match the model's LoRA layers (model.lora.* "
                          f"or model.name_or_path changed?): missing {missing[:5]}, unexpected {unexpected[:5]}")
    wrong = [k for k in sorted(want) if tuple(saved[k].shape) != tuple(want_sd[k].shape)]
    if wrong:  # another base architecture or rank: one line, not one size mismatch per tensor
        k = wrong[0]
        raise ConfigError(f"--resume: the adapter in {folder} was trained on another base model or LoRA rank: "
                          f"{len(wrong)} of {len(want)} adapter tensors differ in shape, e.g. {k!r} "
                          f"(checkpoint {list(saved[k].shape)}, this run {list(want_sd[k].shape)})")
    peft.set_peft_model_state_dict(model, saved)


def read_base_model_spec(folder: str | Path) -> dict[str, Any]:
    """The base model settings a LoRA folder was trained on: ``rlvr_base_model.json``, else peft's
    ``base_model_name_or_path``.

    Raises:
        ModelLoadError: neither names a base model.
    """
    folder = Path(folder)
    f = folder / BASE_MODEL_FILE
    spec: dict[str, Any] = json.loads(f.read_text()) if f.is_file() else {}
    if not spec.get("name_or_path"):
        cfg = json.loads((folder / ADAPTER_CONFIG).read_text())
        if cfg.get("base_model_name_or_path"):
            spec = {"name_or_path": cfg["base_model_name_or_path"]}
    if not spec.get("name_or_path"):
        raise ModelLoadError(f"{folder}: the adapter names no base model ({BASE_MODEL_FILE} missing and "
                             f"{ADAPTER_CONFIG} has no base_model_name_or_path)")
    return spec


def load_adapter_policy(folder: str | Path, model_cfg: Any, *, merge: bool = True) -> tuple[Any, Any]:
    """Load the base model an adapter folder names, attach the adapter, optionally merge it.

    Args:
        folder: a LoRA ``final/`` or ``checkpoint-N/`` (peft adapter format).
        model_cfg: a :class:`rlvr.config.ModelConfig` to start from; its ``name_or_path``,
            ``gguf_file``, ``revision`` and ``cache_dir`` are replaced by the folder's recorded base, and
            ``dtype`` too unless the base recorded ``auto``.
        merge: return ``merge_and_unload()``'s plain model (faster to sample from) instead of the
            ``PeftModel``.

    Returns:
        ``(model, tokenizer)``; the tokenizer is the one saved in the folder when present.

    Raises:
        ModelLoadError: the base cannot be found or loaded, or the adapter does not fit it.
    """
    from rlvr.models import load_policy

    folder = Path(folder)
    spec = read_base_model_spec(folder)
    keep = {k: spec[k] for k in ("name_or_path", "gguf_file", "revision", "cache_dir", "dtype") if k in spec}
    if keep.get("dtype") == "auto":  # the base's auto: model_cfg's dtype (the run's recorded precision in rlvr eval)
        del keep["dtype"]
    base_cfg = model_cfg.model_copy(update={**keep, "lora": type(model_cfg.lora)(), "gradient_checkpointing": False})
    model, tok = load_policy(base_cfg)
    if (folder / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        saved = AutoTokenizer.from_pretrained(str(folder))
        saved.padding_side, saved.pad_token = "left", saved.pad_token or saved.eos_token
        tok = saved
    try:
        pm = _peft().PeftModel.from_pretrained(model, str(folder))
    except Exception as exc:  # noqa: BLE001 - reported with the cause chained
        raise ModelLoadError(f"cannot attach the adapter in {str(folder)!r} to base {spec['name_or_path']!r}: {exc}") from exc
    pm.rlvr_base_model = spec
    return (pm.merge_and_unload(), tok) if merge else (pm, tok)


def export_merged(folder: str | Path, out: str | Path, model_cfg: Any) -> Path:
    """Write the base + adapter of ``folder`` merged into one Hugging Face model folder ``out``
    (safetensors + tokenizer; loads with ``AutoModelForCausalLM.from_pretrained(out)``).

    Raises:
        ModelPathError: ``folder`` holds no adapter (exit 2).
        ModelLoadError: its base cannot be loaded.
        OutputDirError: ``out`` exists and is not empty (exit 2).
    """
    folder, out = Path(folder), Path(out)
    if not folder.is_dir():
        raise ModelPathError(f"rlvr export {folder}: no such folder (expected a LoRA run's final/ or checkpoint-N/)")
    if not is_adapter_folder(folder):
        raise ModelPathError(f"{folder}: no {ADAPTER_CONFIG}: not a LoRA adapter folder (a full model folder "
                             "needs no merge; load it directly)")
    if out.exists() and any(out.iterdir()):
        raise OutputDirError(f"--out {out}: folder exists and is not empty (nothing is overwritten)")
    model, tok = load_adapter_policy(folder, model_cfg, merge=True)
    import shutil

    from rlvr.util.staging import make_staging_dir, remove_stale

    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out.parent, lambda i: i["name"] == out.name and i["kind"] == "tmp")  # killed exports' leftovers
    tmp = make_staging_dir(out)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        if out.exists():
            out.rmdir()
        tmp.replace(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def load_checkpoint_policy(model_cfg: Any, path: str | Path) -> tuple[Any, Any]:
    """Load what ``rlvr eval --checkpoint PATH`` evaluates: a LoRA adapter folder (base + adapter,
    merged for sampling speed) or any model folder :func:`rlvr.models.load_policy` reads.

    Raises:
        ModelPathError: ``path`` does not exist (exit 2).
        ModelLoadError: it cannot be loaded (see the two loaders).
    """
    from rlvr.models import load_policy

    if not Path(path).exists():
        raise ModelPathError(f"--checkpoint {path}: no such folder")
    if is_adapter_folder(path):
        return load_adapter_policy(path, model_cfg, merge=True)
    return load_policy(model_cfg.model_copy(update={"name_or_path": str(path), "lora": type(model_cfg.lora)()}))
