"""Checkpoints: written atomically, read without unpickling untrusted data.

Layout of ``checkpoint-N/``: the policy as a Hugging Face folder (``model.safetensors``, config,
tokenizer), ``optimizer.pt`` and ``scheduler.pt`` (tensors and plain containers only, read with
``torch.load(weights_only=True)``), ``trainer_state.json`` (step, loader position, RNG states, config).
The folder is assembled under a temporary name and renamed into place, so a kill at any moment leaves
either the previous checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

STATE_FILE = "trainer_state.json"


def _rng_state() -> dict[str, Any]:
    py = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state().tolist(),
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def save_checkpoint(trainer: Any, path: str | Path, *, hf_folder: bool = False) -> Path:
    """Atomically write ``trainer``'s full state to ``path`` (replacing an older one there).

    With ``hf_folder`` only the model and tokenizer are written (an export for ``rlvr eval`` or
    ``from_pretrained``), still atomically.

    Returns:
        the final path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        trainer.model.save_pretrained(tmp, safe_serialization=True)
        trainer.tokenizer.save_pretrained(tmp)
        if not hf_folder:
            torch.save(trainer.optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(trainer.scheduler.state_dict(), tmp / "scheduler.pt")
            state = {
                "global_step": trainer.global_step,
                "generation_round": trainer.generation_round,
                "num_tokens": trainer.num_tokens,
                "loader": trainer.loader.state_dict(),
                "rng": _rng_state(),
                "config": trainer.cfg.model_dump(mode="json"),
            }
            (tmp / STATE_FILE).write_text(json.dumps(state))
        with open(tmp / ".complete", "w") as f:
            f.flush()
            os.fsync(f.fileno())
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The complete ``checkpoint-N`` folder with the largest N under ``output_dir``, or None."""
    best, best_step = None, -1
    for p in Path(output_dir).glob("checkpoint-*"):
        try:
            step = int(p.name.split("-", 1)[1])
        except ValueError:
            continue
        if (p / ".complete").exists() and (p / STATE_FILE).exists() and step > best_step:
            best, best_step = p, step
    return best


def load_checkpoint(trainer: Any, path: str | Path) -> dict[str, Any]:
    """Restore model weights, optimizer, scheduler, loader position and RNG states from ``path``.

    Returns:
        the saved ``trainer_state.json`` contents.

    Raises:
        FileNotFoundError: ``path`` is not a complete checkpoint.
    """
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / ".complete").exists() or not (path / STATE_FILE).exists():
        raise FileNotFoundError(f"{path} is not a complete rlvr checkpoint (missing .complete or {STATE_FILE})")
    weights: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    missing, unexpected = trainer.model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if "lm_head" not in k]  # tied heads are not stored separately
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {path} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    trainer.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    trainer.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    state = json.loads((path / STATE_FILE).read_text())
    trainer.global_step = int(state["global_step"])
    trainer.generation_round = int(state["generation_round"])
    trainer.num_tokens = int(state["num_tokens"])
    trainer.loader.load_state_dict(state["loader"])
    _set_rng_state(state["rng"])
    return state
