"""Weight sync: how a generation engine that does not share the trainer's module gets new weights.

Two layers:

* the **sync point** — the engine's ``generation_sync`` attribute, an object with ``version`` (the
  weights' optimizer-update count) and ``push(named_tensors, version)``: the protocol of
  :mod:`rlvr.distributed.weights`, which the trainer's ``sync_weights`` calls before each round
  (:func:`sync_policy` does the same outside a trainer). An engine without one (the colocated
  :class:`~rlvr.engines.hf.HFEngine`, which samples from the very module being trained) needs nothing;
* the **transport** behind a server engine's sync point (:class:`WeightTransport`:
  ``push(state_dict, client)``). :class:`FilesystemWeightSync` works everywhere (CPU included): write
  the weights as safetensors into a directory, pause the server (in-flight requests finish first),
  ``reload_weights`` from that directory, drop the prefix cache (its KV blocks were computed with the
  old weights), resume. vLLM's NCCL weight transfer (``/init_weight_transfer_engine`` +
  ``/update_weights``) needs a GPU and is not implemented here.

Distributed (:class:`ServerWeightSync`): every rank calls ``push`` at the same point and drains the
tensors (gathering sharded ones is a collective); only rank 0 sends them to the shared server, then all
ranks meet at a barrier, so no rank generates from stale weights.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Protocol, runtime_checkable

import torch

__all__ = ["WeightTransport", "FilesystemWeightSync", "ServerWeightSync", "sync_policy", "export_state_dict",
           "named_full_tensors"]


@runtime_checkable
class WeightTransport(Protocol):
    """A transport that makes a server sample from new weights."""

    def push(self, state_dict: Mapping[str, torch.Tensor], client: Any) -> None:
        """Deliver ``state_dict`` (HF checkpoint names) to the server behind ``client``.

        Raises:
            rlvr.engines.vllm_server.VLLMServerError: the server refused a step.
        """
        ...


def export_state_dict(
    model: torch.nn.Module | Mapping[str, torch.Tensor], dtype: torch.dtype | None = None, *, tied: str = "drop"
) -> dict[str, torch.Tensor]:
    """The policy's tensors as a checkpoint holds them: detached, contiguous, CPU, cast to ``dtype``
    (None keeps each tensor's dtype).

    Tied weights (``lm_head.weight`` sharing ``model.embed_tokens.weight``): ``tied="drop"`` keeps
    each storage once, under the first name in ``state_dict()`` order (the embedding; loaders of tied
    models skip the missing head); ``tied="clone"`` writes every name, the later ones as copies — for
    a server that serves the model untied (see :class:`FilesystemWeightSync`). safetensors refuses
    shared storages either way.

    Args:
        model: a module or a name → tensor mapping.
        dtype: the server's dtype (writing bf16 halves the bytes for a bf16 server).
        tied: ``"drop"`` or ``"clone"``.

    Returns:
        name → tensor.

    Raises:
        ValueError: another ``tied`` value.
    """
    if tied not in ("drop", "clone"):
        raise ValueError(f"export_state_dict: tied must be 'drop' or 'clone', got {tied!r}")
    sd = model.state_dict() if isinstance(model, torch.nn.Module) else dict(model)
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    for name, t in sd.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape)) if t.device.type != "meta" else None
        shared = key is not None and key in seen
        if shared and tied == "drop":
            continue
        if key is not None:
            seen.add(key)
        t = t.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        t = t.to("cpu").contiguous()
        out[name] = t.clone() if shared else t
    return out


class FilesystemWeightSync:
    """Push weights by file: safetensors → ``directory/model.safetensors``, pause, reload, resume.

    Args:
        directory: where the file is written (a fresh temporary folder per run). The server must be able to read it (same machine or shared file system).
        dtype: cast floating tensors to this dtype before writing (the server's dtype).
        tied: how tied tensors are written (:func:`export_state_dict`); rlvr's own servers serve tied
            models untied and get ``"clone"``: vLLM 0.32's CPU backend prepacks the output head for its
            GEMM kernels, and an in-place reload that only loads the (shared) embedding leaves the
            packed head stale (measured: generation ignored a pushed head change).

    Attributes:
        pushes: how many pushes completed.
        bytes_written: bytes of the last file.

    The file is written to a temporary name and renamed, so the server never reads a half-written
    file. Source: vLLM 0.32 ``Worker.reload_weights(weights_path=...)`` through the dev-mode
    ``/collective_rpc`` endpoint; ``/pause?mode=wait`` lets in-flight requests finish first.
    """

    def __init__(self, directory: str | Path, dtype: torch.dtype | None = None, *, tied: str = "drop") -> None:
        self.directory = Path(directory)
        self.dtype = dtype
        self.tied = tied
        self.pushes = 0
        self.bytes_written = 0

    def write(self, state_dict: Mapping[str, torch.Tensor]) -> Path:
        """Write ``state_dict`` as one safetensors file; returns its path."""
        from safetensors.torch import save_file

        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / "model.safetensors"
        tmp = self.directory / ".model.safetensors.tmp"
        save_file(export_state_dict(state_dict, self.dtype, tied=self.tied), str(tmp), metadata={"format": "pt"})
        os.replace(tmp, path)
        self.bytes_written = path.stat().st_size
        return path

    def push(self, state_dict: Mapping[str, torch.Tensor], client: Any) -> None:
        """Write, then ``pause(wait)`` → ``reload_weights`` → ``reset_prefix_cache`` → ``resume``.

        ``resume`` runs even when the reload fails, so the server is never left paused.

        Raises:
            rlvr.engines.vllm_server.VLLMServerError: a server call failed.
        """
        self.write(state_dict)
        try:
            client.pause()
        except Exception as e:
            if "HTTP 404" in str(e):
                raise type(e)(f"{e}\n  the weight-sync endpoints exist only when the server runs with "
                              "VLLM_SERVER_DEV_MODE=1 (rlvr sets it for servers it starts)") from None
            raise
        try:
            client.collective_rpc("reload_weights", weights_path=str(self.directory))
            client.reset_prefix_cache()
        finally:
            client.resume()
        self.pushes += 1


def _dist_rank() -> tuple[int, bool]:
    """``(rank, initialised)`` of ``torch.distributed`` (``(0, False)`` when not in use)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), True
    except Exception:
        pass
    return 0, False


def named_full_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of ``model.state_dict()``, sharded ``DTensor`` s gathered to full tensors
    (a collective then: every rank must drain it)."""
    for name, t in model.state_dict().items():
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        yield name, t.detach()


class ServerWeightSync:
    """The sync point of a server engine: ``version`` + ``push(named_tensors, version)``.

    Args:
        transport: how the tensors reach the server (:class:`FilesystemWeightSync`).
        client: the server's client, handed to the transport.

    Attributes:
        version: optimizer-update count of the weights the server holds (0 = as started).
        pushes: completed pushes (on this rank).
    """

    def __init__(self, transport: WeightTransport, client: Any) -> None:
        self.transport = transport
        self.client = client
        self.version = 0
        self.pushes = 0

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Rank 0 (or a single process) sends the tensors; other ranks only drain them; then a barrier.

        ``version`` is recorded only after a successful push (a failed one is retried next round).

        Raises:
            rlvr.engines.vllm_server.VLLMServerError: the server refused a step.
        """
        rank, distributed = _dist_rank()
        if rank == 0:
            self.transport.push(dict(named_tensors), self.client)
            self.pushes += 1
        else:
            for _ in named_tensors:
                pass
        self.version = int(version)
        if distributed:
            import torch.distributed as dist

            dist.barrier()


def sync_policy(engine: Any, model: torch.nn.Module, version: int) -> bool:
    """Make ``engine`` sample from ``model``'s weights at optimizer-update count ``version``.

    Args:
        engine: any engine; one without a ``generation_sync`` sync point is colocated (no-op).
        model: the trained policy.
        version: optimizer updates applied to ``model`` (the trainer's ``global_step``).

    Returns:
        True when the weights were pushed, False when the engine already held ``version`` (or needs
        no sync).
    """
    ws = getattr(engine, "generation_sync", None)
    if ws is None or ws.version == version:
        return False
    ws.push(named_full_tensors(model), version)
    return True
