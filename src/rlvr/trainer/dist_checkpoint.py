"""Checkpoints of a ``torchrun`` job: DCP for model and optimizer, per-rank state, a gathered HF folder.

Layout of ``checkpoint-N/`` (every rank writes its part into one temporary folder that rank 0 renames
into place after a barrier, so a kill leaves the previous checkpoint or the new one):

* ``dcp/`` — ``torch.distributed.checkpoint`` of ``{"model", "optim"}`` (``get_state_dict``: FSDP2 shards
  or replicated tensors; a LoRA policy's adapters only), loadable onto any world size (DCP reshards);
* ``model.safetensors`` + config + tokenizer — the full policy gathered to rank 0 (``rlvr eval`` reads it);
  for a LoRA policy peft's adapter folder instead (``adapter_model.safetensors``, ``rlvr_base_model.json``);
* ``scheduler.pt``, ``trainer_state.json`` — shared state (step, round, loader position: the same on every
  rank, :class:`rlvr.distributed.data.RankPromptLoader`), with ``"world_size"``;
* ``rank-R/`` — rank R's RNG states, schedule state, pending generation batch and dynamic-sampling carry
  (:mod:`rlvr.trainer.checkpoint` writes them as for one process).

Resuming on the same world size continues exactly. On another world size model, optimizer, scheduler and
loader position load; the per-rank parts cannot be mapped to the new ranks, so the generation batch in
progress is dropped (training continues with a fresh round from the saved loader position), the
dynamic-sampling carry is dropped, and rank R takes rank ``R mod old_world``'s RNG and schedule state.
The folder must be on a file system every node sees.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from rlvr.lora import is_peft_model, write_base_model_spec
from rlvr.precision.record import write_precision_record
from rlvr.util.staging import make_staging_dir
from rlvr.trainer.checksums import CHECKSUM_FILE, write_checksums
from rlvr.trainer.checkpoint_state import (
    CHECKPOINT_VERSION,
    STATE_FILE,
    WRITE_ERRORS,
    CheckpointWriteError,
    capture_rng_state,
    data_fingerprint,
    describe_write_error,
    free_space_note,
    load_reward_state,
    load_round_state,
    require_complete,
    restore_counters,
    restore_rng_state,
    reward_state,
    save_round_state,
    swap_into_place,
    trainer_counters,
)

RANK_STATE = "rank_state.json"


def _options(trainer: Any) -> Any:
    """DCP state-dict options: a LoRA policy stores only its trainable (adapter) tensors — the frozen
    base is the model folder it was loaded from and never changes (``ignore_frozen_params``); loading
    then sets those tensors only (``strict=False``: the base is absent by design; an adapter the
    checkpoint lacks still fails, in ``dcp.load``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    lora = is_peft_model(trainer.model)
    return StateDictOptions(ignore_frozen_params=lora, strict=not lora)


_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod.")


def _trainable_fqns(model: Any) -> set[str]:
    """Names of the parameters that require grad, spelt as ``get_state_dict`` spells them (activation
    checkpointing, FSDP1 and ``torch.compile`` wrapper segments removed)."""
    out = set()
    for name, p in model.named_parameters():
        if p.requires_grad:
            for w in _WRAPPER_PREFIXES:
                name = name.replace(w, "")
            out.add(name)
    return out


def _state_dicts(trainer: Any) -> dict[str, Any]:
    """``{"model", "optim"}`` as DCP saves and loads them. A LoRA policy's model part keeps the trainable
    (adapter) tensors only: ``ignore_frozen_params`` misses a frozen tensor that ``named_parameters``
    lists under another name — the LM head tied to the embedding (SmolLM2, the tiny model) — so without
    the filter every checkpoint stored the embedding matrix (113 MB fp32 for SmolLM2-135M) and a load
    wrote it back over the base's. Checkpoints written before the filter still load (DCP reads only the
    keys asked for)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(trainer.model, trainer.optimizer, options=_options(trainer))
    if is_peft_model(trainer.model):
        keep = _trainable_fqns(trainer.model)
        msd = {k: v for k, v in msd.items() if k in keep}
    return {"model": msd, "optim": osd}


def _write_hf_folder(trainer: Any, folder: Path) -> None:
    """Gather the full policy (every rank: one all-gather per sharded tensor) and write it as a Hugging
    Face folder (rank 0, ``save_pretrained(state_dict=...)``).

    A LoRA policy gathers only its adapter tensors and rank 0 writes peft's adapter format
    (``adapter_config.json`` + ``adapter_model.safetensors``, loadable with ``PeftModel.from_pretrained``)
    plus ``rlvr_base_model.json``, as a one-process LoRA run does.
    """
    from rlvr.distributed.weights import full_named_tensors

    lora = is_peft_model(trainer.model)
    keep = (lambda name: ".lora_" in name) if lora else None
    full = dict(full_named_tensors(trainer.model, keep=keep))
    if trainer.rank == 0:
        trainer.model.save_pretrained(folder, state_dict=full, safe_serialization=True)
        trainer.tokenizer.save_pretrained(folder)
        write_precision_record(folder, trainer.precision)  # what --resume and rlvr eval follow
        if lora:
            write_base_model_spec(trainer.model, folder)


def _agree(dp: Any, path: Path, failure: str | None) -> None:
    """Every rank learns whether any rank's part of the save failed (one ``all_gather_object``, which is also
    the barrier between the parts), and all raise together: a rank that failed alone would otherwise leave
    the others waiting in the next collective until ``distributed.timeout_s``.

    Raises:
        CheckpointWriteError: naming ``path``, each failed rank, the file or stage and the cause.
    """
    failures = [f for f in dp.gather(failure) if f]
    if failures:
        raise CheckpointWriteError(
            f"could not write checkpoint {path} ({'; '.join(failures)}){free_space_note(path.parent)}; the partial "
            "folder was removed, so nothing half-written is left (an older checkpoint there is unchanged)"
        )


def save_distributed(trainer: Any, path: str | Path, *, hf_folder: bool = False) -> Path:
    """Write ``trainer``'s job state to ``path`` (call on every rank; see the module docstring).

    With ``hf_folder`` only the gathered Hugging Face folder is written (the final export).

    A failed write on any rank (:data:`~rlvr.trainer.checkpoint_state.WRITE_ERRORS`: ``OSError``,
    ``SafetensorError``, ``torch.save``'s ``RuntimeError``, DCP's ``CheckpointException``) is agreed on after
    each part (the gathered model, DCP, the per-rank and shared state, rank 0's rename), so every rank raises
    the same error at the same point and none waits in a collective; rank 0 removes the staging folder, and
    an older checkpoint at ``path`` stays in place (:func:`~rlvr.trainer.checkpoint_state.swap_into_place`).

    Returns:
        the final path.

    Raises:
        CheckpointWriteError: on every rank, naming the checkpoint, the failed ranks, file or stage and cause.
    """
    import torch.distributed.checkpoint as dcp

    dp = trainer.dp
    path = Path(path)
    rank = trainer.rank

    def failed(stage: str, exc: BaseException) -> str:
        return f"rank {rank}, {stage}: {describe_write_error(exc)}"

    tmp_name, failure = None, None
    if rank == 0:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp_name = str(make_staging_dir(path))
        except OSError as exc:
            failure = failed("the staging folder", exc)
    tmp_name, failure = dp.broadcast((tmp_name, failure))
    _agree(dp, path, failure)
    tmp = Path(tmp_name)
    try:
        failure = None
        try:
            _write_hf_folder(trainer, tmp)
        except WRITE_ERRORS as exc:
            failure = failed("model.safetensors and tokenizer (the gathered policy)", exc)
        _agree(dp, path, failure)
        if not hf_folder:
            try:
                dcp.save(_state_dicts(trainer), checkpoint_id=str(tmp / "dcp"))
            except WRITE_ERRORS as exc:  # DCP gathers every rank's failure and raises it on all of them
                failure = failed("dcp/ (sharded model and optimizer)", exc)
            _agree(dp, path, failure)
            _agree(dp, path, _write_state_files(trainer, tmp))
        if rank == 0:
            failure = _seal(tmp, path)
        _agree(dp, path, failure)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _write_state_files(trainer: Any, tmp: Path) -> str | None:
    """Write this rank's ``rank-<r>/`` state (RNG and round state) and, on rank 0, ``scheduler.pt`` and the
    shared ``trainer_state.json`` into the staging folder ``tmp``; the failure (rank, file, cause) or None."""
    rank = trainer.rank
    stage = f"rank-{rank}/{RANK_STATE} and the round state"
    try:
        rank_dir = tmp / f"rank-{rank}"
        rank_dir.mkdir(parents=True, exist_ok=True)
        rank_state = {"rng": capture_rng_state(), **save_round_state(trainer, rank_dir), **reward_state(trainer)}
        (rank_dir / RANK_STATE).write_text(json.dumps(rank_state))
        if rank == 0:
            stage = "scheduler.pt"
            torch.save(trainer.scheduler.state_dict(), tmp / "scheduler.pt")
            stage = STATE_FILE
            state = {
                "version": CHECKPOINT_VERSION, "distributed": True, "world_size": trainer.world_size,
                **trainer_counters(trainer),
                "loader": trainer.loader.state_dict(),
                "config": trainer.run_config.model_dump(mode="json"),
                "data": data_fingerprint(trainer.cfg.task),
            }
            (tmp / STATE_FILE).write_text(json.dumps(state))
    except WRITE_ERRORS as exc:
        return f"rank {rank}, {stage}: {describe_write_error(exc)}"
    return None


def _seal(tmp: Path, path: Path) -> str | None:
    """Rank 0, once every rank's files are in ``tmp``: the checksums, ``.complete`` (fsynced), the rename
    into place at ``path``; the failure (stage, cause) or None."""
    stage = CHECKSUM_FILE
    try:
        write_checksums(tmp)  # every rank's files are in (the agreement before this): verified before a resume
        stage = ".complete"
        with open(tmp / ".complete", "w") as f:
            f.flush()
            os.fsync(f.fileno())
        stage = "the rename into place"
        swap_into_place(tmp, path)
    except WRITE_ERRORS as exc:
        return f"rank 0, {stage}: {describe_write_error(exc)}"
    return None


def is_distributed_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` was written by :func:`save_distributed` (it has a ``dcp/`` folder)."""
    return (Path(path) / "dcp").is_dir()


def load_distributed(trainer: Any, path: str | Path, state: dict[str, Any] | None = None) -> dict[str, Any]:
    """Restore a :func:`save_distributed` checkpoint into ``trainer`` (every rank; any world size,
    including one process without a process group).

    Args:
        trainer: the trainer to restore into.
        path: the checkpoint folder.
        state: its ``trainer_state.json`` when the caller already read it with
            :func:`~rlvr.trainer.checkpoint_state.require_complete` (``load_checkpoint`` does).

    Returns:
        the shared ``trainer_state.json`` contents.

    Raises:
        FileNotFoundError: ``path`` is not a complete checkpoint.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    path = Path(path)
    state = dict(require_complete(path) if state is None else state)
    sd = _state_dicts(trainer)
    dcp.load(sd, checkpoint_id=str(path / "dcp"))
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"],
                   options=_options(trainer))
    trainer.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    restore_counters(trainer, state)  # incl. rollout_round (the next round's sampling seed)
    trainer.loader.load_state_dict(state["loader"])
    old_world = int(state.get("world_size", 1))
    same = old_world == trainer.world_size
    rank_dir = path / f"rank-{trainer.rank % old_world}"
    rank_state = json.loads((rank_dir / RANK_STATE).read_text())
    if not same:  # per-rank rollouts do not map onto other ranks: drop them (module docstring)
        rank_state = {**rank_state, "pending": None, "num_carry": 0}
    load_round_state(trainer, rank_dir, rank_state)
    load_reward_state(trainer, rank_state)  # each rank's running reward statistics are its own
    restore_rng_state(rank_state["rng"])
    state["resharded_from"] = None if same else old_world
    return state
