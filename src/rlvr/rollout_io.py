"""Save and load a :class:`rlvr.types.RolloutBatch` without pickle: tensors in safetensors, the rest JSON.

Used by checkpoints to keep a generation batch whose optimizer updates are not all done yet (μ > 1)
and the dynamic-sampling carry, so a resumed run continues mid-batch with the very same rollouts.

Layout for ``save_rollouts(batch, folder, name)``:

* ``<name>.safetensors`` — every tensor field under its field name (``completion_ids``,
  ``advantages``, ...) and each reward component as ``reward_components/<key>``;
* ``<name>.json`` — the list fields (``context_ids``, ``texts``, ``feedback``, ``context_kind``),
  the sampler structure (``tree_index``, ``fbos_parent_row``, ``variable_group_sizes``,
  ``generated_tokens``, ``metrics``) under ``structure``, and the problems as plain dicts. (Files
  written before the structure fields existed kept it under ``meta``; it is read from there.)

Loading never runs code from the files: safetensors holds raw tensors, JSON holds plain data.
Problems are restored by ``uid`` from a caller-given mapping (the task's own objects, exact) and
otherwise rebuilt as :class:`rlvr.tasks.base.Problem` from the stored fields.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path
from typing import Any, Mapping

import torch

from rlvr.types import RolloutBatch

FORMAT_VERSION = 1
_LIST_FIELDS = ("context_ids", "texts", "feedback", "context_kind")
_STRUCTURE_FIELDS = ("tree_index", "fbos_parent_row", "variable_group_sizes", "generated_tokens", "metrics")


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=True)
        return True
    except (TypeError, ValueError):
        return False


def _problem_to_dict(p: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(p) and not isinstance(p, type):
        d = {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}
    elif isinstance(p, Mapping):
        d = dict(p)
    else:
        d = {"uid": getattr(p, "uid", None), "question": getattr(p, "question", str(p)),
             "answer": getattr(p, "answer", None)}
    return json.loads(json.dumps(d, default=repr))


def rollouts_to_state(batch: RolloutBatch, *, warn: bool = True) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(tensors, doc)``: every tensor field under its name (reward components as
    ``reward_components/<key>``) and a JSON-serialisable document with the list fields, the sampler
    structure (``metrics`` entries that are not JSON numbers are named in ``metrics_dropped``, with a
    warning when ``warn``) and the problems as plain dicts. The one serialiser of :class:`RolloutBatch` (files: :func:`save_rollouts`;
    in-memory checkpoint state: the UEC replay buffers)."""
    tensors: dict[str, torch.Tensor] = {}
    for f in dataclasses.fields(batch):
        v = getattr(batch, f.name)
        if torch.is_tensor(v):
            tensors[f.name] = v.detach().contiguous().clone()
    for k, v in batch.reward_components.items():
        tensors[f"reward_components/{k}"] = v.detach().contiguous().clone()
    structure = {k: getattr(batch, k) for k in _STRUCTURE_FIELDS}
    dropped = [k for k, v in batch.metrics.items() if not _jsonable(v)]
    structure["metrics"] = {k: v for k, v in batch.metrics.items() if k not in dropped}
    if dropped and warn:
        warnings.warn(f"save_rollouts: metrics {dropped} are not JSON-serialisable and were not saved", stacklevel=3)
    doc = {
        "format_version": FORMAT_VERSION,
        "num_rows": len(batch),
        "lists": {k: getattr(batch, k) for k in _LIST_FIELDS},
        "structure": structure,
        "metrics_dropped": dropped,
        "problems": [_problem_to_dict(p) for p in batch.problems],
    }
    return tensors, doc


def rollouts_from_state(
    tensors: Mapping[str, torch.Tensor], doc: Mapping[str, Any], *, problems_by_uid: Mapping[str, Any] | None = None,
    where: str = "rollouts",
) -> RolloutBatch:
    """Inverse of :func:`rollouts_to_state` (bit-identical tensors; problems as in :func:`load_rollouts`).

    Raises:
        ValueError: an unknown format version, or inconsistent row counts (``where`` names the source).
    """
    from rlvr.tasks.base import Problem

    if doc.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"load_rollouts: {where} has format_version {doc.get('format_version')!r}, expected {FORMAT_VERSION}")
    kwargs: dict[str, Any] = {}
    comps: dict[str, torch.Tensor] = {}
    for k, v in tensors.items():
        if k.startswith("reward_components/"):
            comps[k.split("/", 1)[1]] = v
        else:
            kwargs[k] = v
    for k in _LIST_FIELDS:
        kwargs[k] = doc["lists"].get(k)
    kwargs["context_ids"] = [list(map(int, c)) for c in kwargs["context_ids"]]
    kwargs["reward_components"] = comps
    structure = doc.get("structure", doc.get("meta", {}))  # "meta": files written before the typed fields
    for k in _STRUCTURE_FIELDS:
        if structure.get(k) is not None:
            kwargs[k] = structure[k]
    probs = []
    for d in doc.get("problems", []):
        uid = d.get("uid")
        if problems_by_uid is not None and uid in problems_by_uid:
            probs.append(problems_by_uid[uid])
        else:
            probs.append(Problem(uid=str(uid), question=d.get("question", ""), answer=d.get("answer"),
                                 metadata=d.get("metadata") or {}))
    kwargs["problems"] = probs
    batch = RolloutBatch(**kwargs)
    if len(batch) != doc["num_rows"] or batch.completion_ids.shape[0] != doc["num_rows"]:
        raise ValueError(f"load_rollouts: {where} is inconsistent ({len(batch)} context rows, "
                         f"{batch.completion_ids.shape[0]} tensor rows, {doc['num_rows']} expected)")
    return batch


def save_rollouts(batch: RolloutBatch, folder: str | Path, name: str = "rollouts") -> list[Path]:
    """Write ``batch`` as ``folder/<name>.safetensors`` + ``folder/<name>.json`` (:func:`rollouts_to_state`).

    ``metrics`` entries that are not JSON-serialisable are left out with a warning naming them.

    Returns:
        the two paths written.

    Raises:
        OSError: the folder cannot be written.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors, doc = rollouts_to_state(batch)
    st = folder / f"{name}.safetensors"
    js = folder / f"{name}.json"
    save_file(tensors, str(st))
    js.write_text(json.dumps(doc))
    return [st, js]


def load_rollouts(
    folder: str | Path, name: str = "rollouts", *, problems_by_uid: Mapping[str, Any] | None = None
) -> RolloutBatch:
    """Read a batch written by :func:`save_rollouts`.

    Args:
        folder: the folder holding ``<name>.safetensors`` and ``<name>.json``.
        problems_by_uid: the task's problems keyed by ``uid``; a stored problem whose uid is found
            there is replaced by that object (bit-identical to the original run), otherwise it is
            rebuilt as a :class:`rlvr.tasks.base.Problem` from its stored fields.

    Raises:
        FileNotFoundError: a file is missing.
        ValueError: the files are of an unknown format version or inconsistent (row counts differ).
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    st, js = folder / f"{name}.safetensors", folder / f"{name}.json"
    for p in (st, js):
        if not p.exists():
            raise FileNotFoundError(f"load_rollouts: {p} is missing")
    return rollouts_from_state(load_file(str(st)), json.loads(js.read_text()), problems_by_uid=problems_by_uid,
                               where=f"{folder}/{name}")


def batches_equal(a: RolloutBatch, b: RolloutBatch) -> bool:
    """True when every tensor, list and reward component of ``a`` and ``b`` match exactly (NaN = NaN).

    ``problems`` are compared by ``uid`` and ``metrics`` by its JSON-serialisable entries.
    """
    for f in dataclasses.fields(RolloutBatch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "problems":
            if [getattr(p, "uid", p) for p in x] != [getattr(p, "uid", p) for p in y]:
                return False
        elif f.name == "metrics":
            if {k: v for k, v in x.items() if _jsonable(v)} != {k: v for k, v in y.items() if _jsonable(v)}:
                return False
        elif f.name == "reward_components":
            if x.keys() != y.keys() or not all(torch.equal(x[k].nan_to_num(math.pi), y[k].nan_to_num(math.pi)) for k in x):
                return False
        elif torch.is_tensor(x) or torch.is_tensor(y):
            if not (torch.is_tensor(x) and torch.is_tensor(y)) or x.dtype != y.dtype or x.shape != y.shape:
                return False
            if not torch.equal(x.nan_to_num(math.pi) if x.is_floating_point() else x,
                               y.nan_to_num(math.pi) if y.is_floating_point() else y):
                return False
        elif x != y:
            return False
    return True
