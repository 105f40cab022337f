"""Combine the per-sample JSONL files of an evaluation done in pieces into one result and table.

A test split too long for one sitting is evaluated in shards (``rlvr eval --offset A --limit N``,
one ``X.samples.jsonl`` each); ``rlvr eval-merge SHARD.samples.jsonl ...`` reads them back and
recomputes every metric and interval over the union of problems with
:func:`rlvr.eval.summary.summarize_records` — the code a single run uses — so the merged numbers
are those of one run over all the problems (the intervals are over all problems, not combined
shard intervals). A shard cut short still counts the problems it finished (its JSONL is flushed
per batch); its settings are then unknown, which the result says (``shards[i].complete``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from rlvr.errors import ConfigError, DataError
from rlvr.eval.summary import summarize_records

__all__ = ["SETTINGS", "merge_samples", "read_samples", "write_merged"]

SETTINGS = ("task", "split", "num_samples", "temperature", "decoding", "top_p", "max_new_tokens", "seed", "ks",
            "num_problems_total", "continuous_batching")
"""Result keys every shard with a JSON must agree on (a merge of different settings would mean nothing; a
shard JSON written before a key existed, e.g. ``continuous_batching``, is not checked on it)."""


def read_samples(path: str | Path) -> list[dict[str, Any]]:
    """The problem records of one per-sample JSONL file, in file order.

    A last line cut off mid-write (an interrupted run) is skipped; any other unreadable line is an error.

    Raises:
        DataError: the file is missing or empty, or a line is not a JSON object with ``uid`` and
            ``samples`` (names the file and line).
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such per-sample JSONL file (expected an X.samples.jsonl written by rlvr eval)")
    lines = p.read_text(encoding="utf-8").splitlines()
    out: list[dict[str, Any]] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):
                break  # torn last line of an interrupted run
            raise DataError(f"{p}:{i}: not a JSON line") from None
        if not isinstance(rec, dict) or "uid" not in rec or not isinstance(rec.get("samples"), list):
            raise DataError(f"{p}:{i}: expected a problem record with 'uid' and 'samples' (rlvr eval's X.samples.jsonl)")
        out.append(rec)
    if not out:
        raise DataError(f"{p}: no problem records")
    return out


def _shard_json(samples_path: Path) -> dict[str, Any] | None:
    """The result JSON written next to ``X.samples.jsonl`` (``X.json``), if the shard finished."""
    name = samples_path.name
    stem = name[: -len(".samples.jsonl")] if name.endswith(".samples.jsonl") else samples_path.stem
    js = samples_path.with_name(stem + ".json")
    if not js.is_file():
        return None
    try:
        return json.loads(js.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _shard_precisions(recs: list[dict[str, Any]], js: dict[str, Any] | None) -> set[str]:
    """The precisions a shard ran at: its records' ``precision`` and its JSON's (none for older shards)."""
    found = {str(r["precision"]) for r in recs if r.get("precision")}
    if js is not None and js.get("precision"):
        found.add(str(js["precision"]))
    return found


def _merged_precision(by_shard: dict[Path, set[str]], allow_mixed: bool) -> str | None:
    """The merged result's ``precision``: the one all shards ran at, ``"mixed (a, b)"`` when allowed.

    Raises:
        DataError: shards ran at different precisions and ``allow_mixed`` is False (names each shard's).
    """
    known = sorted(set().union(*by_shard.values())) if by_shard else []
    if len(known) <= 1:
        return known[0] if known else None
    if not allow_mixed:
        each = "; ".join(f"{p}: {', '.join(sorted(v)) or 'not recorded'}" for p, v in by_shard.items())
        raise DataError(f"eval-merge: the shards ran at different precisions ({each}); evaluate them at one "
                        "model.dtype, or pass --allow-mixed-precision to merge them anyway")
    return f"mixed ({', '.join(known)})"


def merge_samples(paths: Sequence[str | Path], *, seed: int | None = None,
                  allow_mixed_precision: bool = False) -> dict[str, Any]:
    """Merge shards' per-sample JSONL files (one model each) into one evaluation result.

    Problems keep the order of ``paths`` and, within a file, file order. The k of pass@k / maj@k are
    those every record has. Settings (``SETTINGS``) come from each shard's ``X.json`` when it exists,
    and must agree; ``seed`` (default: the shards' seed, else 0) seeds the bootstrap intervals. The shards'
    precisions (their records' and JSON's ``precision``) must agree too unless ``allow_mixed_precision``;
    the result's ``precision`` is theirs (``"mixed (bf16, fp32)"`` when allowed to differ).

    Returns:
        the settings, ``num_problems``, ``problems`` (``"N of M"`` when the shards' JSON give M),
        every metric of :func:`rlvr.eval.summary.summarize_records`, ``shards`` (path, problems,
        row_range, complete, time_s, tokens_per_s of each) and ``records`` (all problem records, for
        writing the merged JSONL).

    Raises:
        DataError: no paths, an unreadable file, a problem ``uid`` in two shards, shards of
            different models, shards whose settings differ (each names the files and the key), or
            shards of different precisions (unless allowed).
    """
    if not paths:
        raise DataError("eval-merge: no per-sample JSONL files given")
    records: list[dict[str, Any]] = []
    where: dict[str, Path] = {}
    shards: list[dict[str, Any]] = []
    settings: dict[str, Any] = {}
    settings_from: Path | None = None
    precisions: dict[Path, set[str]] = {}
    for raw in paths:
        p = Path(raw)
        recs = read_samples(p)
        for rec in recs:
            uid = str(rec["uid"])
            if uid in where:
                raise DataError(f"eval-merge: problem {uid!r} is in both {where[uid]} and {p} (overlapping shards)")
            where[uid] = p
        models = {rec.get("model") for rec in records[:1] + recs}
        if len(models) > 1:
            raise DataError(f"eval-merge: {p} holds model(s) {sorted(map(str, models))}; merge one model's shards at a time")
        js = _shard_json(p)
        precisions[p] = _shard_precisions(recs, js)
        shard = {"path": str(p), "problems": len(recs), "complete": js is not None,
                 "precision": ", ".join(sorted(precisions[p])) or None}
        if js is not None:
            shard.update({k: js.get(k) for k in ("row_range", "time_s", "tokens_per_s", "torch_threads") if k in js})
            if js.get("num_problems") is not None and js["num_problems"] != len(recs):
                shard["complete"] = False
            for key in SETTINGS:
                if key not in js:
                    continue
                if key in settings and settings[key] != js[key]:
                    raise DataError(f"eval-merge: {p} has {key}={js[key]!r} but {settings_from} has {settings[key]!r}")
                settings.setdefault(key, js[key])
                settings_from = settings_from or p
        shards.append(shard)
        records += recs
    ks = sorted(set.intersection(*(set(map(int, r.get("pass", {}))) for r in records)))
    if not ks:
        raise DataError("eval-merge: the records share no k (their 'pass' keys differ)")
    seed = int(settings.get("seed", 0)) if seed is None else seed
    total = settings.get("num_problems_total")
    n = len(records)
    out: dict[str, Any] = {**settings, "model": records[0].get("model"), "ks": ks, "num_problems": n,
                           "problems": (f"all {total}" if total == n else f"{n} of {total}") if total else f"{n}"}
    out["precision"] = _merged_precision(precisions, allow_mixed_precision)
    out.update(summarize_records(records, ks, seed=seed))
    out["shards"] = shards
    out["records"] = records
    return out


def write_merged(samples: Sequence[str | Path], json_path: Path, *,
                 allow_mixed_precision: bool = False) -> tuple[dict[str, Any], Path, Path]:
    """Merge ``samples`` (:func:`merge_samples`) and write ``X.json`` (the result, and ``rows`` with its
    one table row), ``X.md`` (the table) and ``X.samples.jsonl`` (the shards' lines, in order) for
    ``json_path`` = ``X.json``.

    Returns:
        ``(merged result without records, md path, samples path)``.

    Raises:
        ConfigError: ``json_path`` is a folder, is not writable, or its samples file is one of the inputs.
        DataError: as :func:`merge_samples`.
    """
    from rlvr.eval.report import ModelSpec, companion_paths, summary_row, write_report

    if json_path.is_dir():
        raise ConfigError(f"--out {json_path}: is a directory (expected a JSON file path)")
    md_path, samples_path = companion_paths(json_path)
    if any(Path(p).resolve() == samples_path.resolve() for p in samples):
        raise ConfigError(f"--out {json_path}: would overwrite the input {samples_path}")
    merged = merge_samples(samples, allow_mixed_precision=allow_mixed_precision)
    records = merged.pop("records")
    row = summary_row(merged, ModelSpec(str(merged.get("model") or "model"), None, None))
    try:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        samples_path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        write_report([row], json_path, md_path, single=merged)
    except OSError as exc:
        raise ConfigError(f"--out {json_path}: cannot write the merged files there ({exc.strerror or exc})") from None
    return merged, md_path, samples_path
