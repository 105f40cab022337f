"""Build the generation engine a run config names (``engine: hf | vllm``).

``hf``: :class:`~rlvr.engines.hf.HFEngine` on the trained module itself (colocated, no sync).
``vllm``: :class:`~rlvr.engines.vllm_engine.VLLMEngine` — the policy's current weights and tokenizer
are written to a folder, a server is started on it (or ``vllm.url`` is used), and a
:class:`~rlvr.engines.weight_sync.FilesystemWeightSync` pushes later weights.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from rlvr.engines.base import engine_eos_ids
from rlvr.errors import ConfigError

__all__ = ["build_engine", "check_engine_config", "vllm_dtype", "write_served_policy"]

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def vllm_dtype(cfg: Any, model: Any = None) -> str:
    """The server's dtype name: ``vllm.dtype``, or for ``auto`` the generation dtype of the run's precision
    policy (:mod:`rlvr.precision`: the policy attached to ``model``, else ``model.dtype`` resolved for
    the CPU) — bf16 where the policy decodes in bf16, float32 elsewhere.

    Source: issue 15 item 1 — the engine's generation precision follows the training policy; vLLM
    computes its log-softmax in fp32 whatever the weights' dtype.
    """
    if cfg.vllm.dtype != "auto":
        return cfg.vllm.dtype
    from rlvr.precision import model_precision, resolve_precision

    policy = model_precision(model) if model is not None else None
    if policy is None:
        policy = resolve_precision(cfg.model.dtype, log=False)
    names = {v: k for k, v in _TORCH_DTYPES.items()}
    # the compute dtype, not generation_dtype: vLLM has no autocast, so generation_autocast (an HF-engine
    # option) does not make it serve float32 weights
    return names.get(policy.compute_dtype, "float32")


def check_engine_config(cfg: Any) -> None:
    """Cheap checks before any model loads.

    Raises:
        ConfigError: ``engine=vllm`` without ``vllm.url`` and ``vllm.python`` is not a file.
    """
    if cfg.engine != "vllm" or cfg.vllm.url:
        return
    if not Path(cfg.vllm.python).is_file():
        raise ConfigError(
            f"engine=vllm: vllm.python={cfg.vllm.python} does not exist. Build the vLLM environment with "
            "`make vllm-env` (it creates .venv-vllm), set vllm.python=/path/to/its/bin/python, or connect "
            "to a running server with vllm.url=http://HOST:PORT"
        )


def _world_size() -> int:
    try:
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    except Exception:
        return 1


def _scratch_dir(cfg: Any) -> tuple[Path, bool]:
    """``(folder, created)``: ``vllm.sync_dir`` or a fresh temporary folder (the system's temp dir: not
    ``/dev/shm``, whose pages would hold a second copy of the weights in RAM)."""
    if cfg.vllm.sync_dir:
        p = Path(cfg.vllm.sync_dir)
        p.mkdir(parents=True, exist_ok=True)
        return p, False
    return Path(tempfile.mkdtemp(prefix="rlvr-vllm-")), True


def write_served_policy(model: torch.nn.Module, tokenizer: Any, folder: Path, dtype: torch.dtype) -> Path:
    """Write the Hugging Face folder a server starts from: config, generation config, tokenizer and the
    current weights (one safetensors file, in the server's ``dtype``).

    A model with tied input/output embeddings is written **untied** (``tie_word_embeddings: false``
    and ``lm_head.weight`` stored as a copy): vLLM 0.32's CPU backend prepacks the output head for its
    GEMM kernels, and a later in-place ``reload_weights`` that loads only the shared embedding leaves
    the packed head stale; with its own ``lm_head.weight`` the head is reloaded and repacked. The
    values served are the same; the cost is one more vocabulary × hidden matrix in the server.

    Returns:
        ``folder``.
    """
    import copy as _copy

    from safetensors.torch import save_file

    from rlvr.engines.weight_sync import export_state_dict

    folder.mkdir(parents=True, exist_ok=True)
    config = _copy.deepcopy(model.config)
    if getattr(config, "tie_word_embeddings", False):
        config.tie_word_embeddings = False
    config.save_pretrained(folder)
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    save_file(export_state_dict(model, dtype, tied="clone"), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def build_engine(cfg: Any, model: torch.nn.Module, tokenizer: Any, output_dir: str | Path) -> Any:
    """The engine ``cfg.engine`` names, ready to generate from ``model``'s current weights.

    Args:
        cfg: the run config (``engine``, ``vllm``, ``seed``).
        model: the policy (its current weights are what the server starts with).
        tokenizer: its tokenizer (saved next to the weights for the server).
        output_dir: run folder; the server log goes to ``<output_dir>/vllm_server.log`` unless
            ``vllm.log_file`` says otherwise.

    Returns:
        an engine; a :class:`~rlvr.engines.vllm_engine.VLLMEngine` owns its server and temporary
        folder and releases both in ``close()``.

    Raises:
        ConfigError: see :func:`check_engine_config`.
        rlvr.engines.vllm_server.VLLMServerError: the server did not come up.
    """
    if cfg.engine == "hf":
        from rlvr.engines.hf import HFEngine

        return HFEngine(model, tokenizer, continuous=getattr(cfg, "continuous_batching", False))
    check_engine_config(cfg)
    from rlvr.engines.vllm_engine import VLLMClient, VLLMEngine
    from rlvr.engines.vllm_server import VLLMServer, VLLMServerError
    from rlvr.engines.weight_sync import FilesystemWeightSync

    v = cfg.vllm
    if not v.url and _world_size() > 1:
        raise ConfigError(
            "engine=vllm under torchrun: start one vLLM server for the job (docs/vllm.md) and pass "
            "vllm.url=http://HOST:PORT; every rank sends its prompts to it and rank 0 pushes the weights"
        )
    dtype = vllm_dtype(cfg, model)
    scratch, created = _scratch_dir(cfg)
    server = None
    try:
        if v.url:
            client = VLLMClient(v.url, timeout_s=v.request_timeout_s)
            names = client.models()
            name = v.served_model_name if v.served_model_name in names or len(names) != 1 else names[0]
            if name not in names:
                raise VLLMServerError(f"vllm.url={v.url} serves {names}, not vllm.served_model_name={name!r}")
        else:
            policy_dir = write_served_policy(model, tokenizer, scratch / "policy", _TORCH_DTYPES[dtype])
            args = ["--dtype", dtype, "--seed", str(cfg.seed)]
            if v.enforce_eager:
                args.append("--enforce-eager")
            if v.max_model_len:
                args += ["--max-model-len", str(v.max_model_len)]
            log = Path(v.log_file) if v.log_file else Path(output_dir) / "vllm_server.log"
            server = VLLMServer(
                v.python, policy_dir, host=v.host, port=v.port, args=[*args, *v.args], log_path=log,
                env={"VLLM_CPU_KVCACHE_SPACE": f"{v.cpu_kv_cache_gib:g}", **v.env},  # env wins
                startup_timeout_s=v.startup_timeout_s, served_model_name=v.served_model_name,
            ).start()
            client = VLLMClient(server.url, timeout_s=v.request_timeout_s)
            name = v.served_model_name
        # Always push the head as its own tensor: servers rlvr starts serve tied models untied
        # (write_served_policy), and so may a vllm.url server (e.g. one started from that folder, as
        # benchmarks/bench_vllm_torchrun.py does); a server that serves the model tied skips
        # lm_head.weight when loading, so the copy is harmless there.
        sync = FilesystemWeightSync(scratch / "weights", _TORCH_DTYPES[dtype], tied="clone") if v.weight_sync == "filesystem" else None
        engine = VLLMEngine(
            client, eos_token_ids=engine_eos_ids(model, tokenizer), model_name=name, transport=sync,
            max_concurrency=v.max_concurrency, server=server, weights_dtype=_TORCH_DTYPES[dtype],
            seed_requests=v.seed_requests,
        )
    except BaseException:
        if server is not None:
            server.close()
        if created:
            shutil.rmtree(scratch, ignore_errors=True)
        raise
    if created:
        engine.on_close.append(lambda: shutil.rmtree(scratch, ignore_errors=True))
    return engine
