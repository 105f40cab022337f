"""Several models on one benchmark: which checkpoints, and the table + JSON with a row per model.

``rlvr eval --checkpoint A --checkpoint B`` (or ``--checkpoint RUN_DIR``) evaluates each model
with the same problems, samples and seeds, then writes one Markdown table and one JSON
(:func:`write_report`) plus one per-problem JSONL (:class:`SamplesWriter`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Sequence

from rlvr.errors import ModelPathError
from rlvr.util.staging import write_text_atomic

BASE = "base"
"""``--checkpoint base``: the configuration's own model (``model.name_or_path``), e.g. step 0 of a curve."""

_CKPT = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True)
class ModelSpec:
    """One model to evaluate.

    Attributes:
        label: its name in the table (``checkpoint-20``, ``final``, ``base`` or the path given).
        path: what ``model.name_or_path`` becomes (None: the configuration's model).
        step: the training step (``checkpoint-N`` → N; ``base`` → 0), or None when unknown (``final``).
    """

    label: str
    path: str | None
    step: int | None


def _is_model_folder(p: Path) -> bool:
    return (p / "config.json").is_file() or (p / "adapter_config.json").is_file()  # HF model or LoRA adapter


def run_checkpoints(run_dir: Path) -> list[ModelSpec]:
    """The models of a run directory in training order: complete ``checkpoint-N`` folders by N,
    then ``final`` (if present). Half-written checkpoints (no ``.complete`` marker) are skipped."""
    found: list[tuple[int, Path]] = []
    for p in run_dir.iterdir():
        m = _CKPT.match(p.name)
        if m and p.is_dir() and (p / ".complete").exists() and _is_model_folder(p):
            found.append((int(m.group(1)), p))
    specs = [ModelSpec(p.name, str(p), n) for n, p in sorted(found)]
    final = run_dir / "final"
    if _is_model_folder(final):
        specs.append(ModelSpec("final", str(final), None))
    return specs


def resolve_models(checkpoints: Sequence[str]) -> list[ModelSpec]:
    """Expand ``--checkpoint`` values into the models to evaluate, in the order given.

    Each value is ``base`` (the configuration's model), a model folder (has ``config.json``), a
    ``.gguf`` file, or a run directory (its ``checkpoint-N`` folders by step, then ``final``). An
    empty list means the configuration's model alone.

    Raises:
        ModelPathError: a value that is none of these (names it and what was expected; exit 2).
    """
    if not checkpoints:
        return [ModelSpec(BASE, None, 0)]
    out: list[ModelSpec] = []
    for value in checkpoints:
        p = Path(value)
        if value == BASE:
            out.append(ModelSpec(BASE, None, 0))
        elif _is_model_folder(p) or (p.is_file() and p.suffix == ".gguf"):
            m = _CKPT.match(p.name)
            out.append(ModelSpec(value, value, int(m.group(1)) if m else None))
        elif p.is_dir():
            found = run_checkpoints(p)
            if not found:
                raise ModelPathError(
                    f"--checkpoint {value}: neither a model folder (no config.json) nor a run directory with "
                    "checkpoint-N/ or final/ model folders"
                )
            out += [ModelSpec(f"{value.rstrip('/')}/{s.label}", s.path, s.step) for s in found]
        else:
            raise ModelPathError(f"--checkpoint {value}: no such folder or .gguf file (or 'base' for the config's model)")
    labels = [s.label for s in out]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ModelPathError(f"--checkpoint: {', '.join(dup)} given more than once")
    return out


def summary_row(result: dict[str, Any], spec: ModelSpec) -> dict[str, Any]:
    """One table row: the result without ``per_problem``, plus the model's label, path and step."""
    row = {"model": spec.label, "path": spec.path, "step": spec.step}
    row.update({k: v for k, v in result.items() if k not in ("per_problem", "model")})
    return row


def _fmt(row: dict[str, Any], metric: str) -> str:
    v = row.get(metric)
    if v is None:
        return "–"
    ci = row.get(f"ci95/{metric}")
    return f"{v:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{v:.3f}"


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table with a row per model: pass@k and maj@k for every k (value [95 % CI]),
    mean reward, mean completion length and clipped share; a header line states the benchmark,
    problems, samples, decoding and the precision the rows ran at (``precision``; rows of different
    precisions get a precision column and the header flags them), and a footer how the intervals were
    computed."""
    if not rows:
        raise ValueError("markdown_table: no rows")
    ks = sorted({k for r in rows for k in r.get("ks", [])})
    metrics = [f"pass@{k}" for k in ks] + [f"maj@{k}" for k in ks if any(f"maj@{k}" in r for r in rows)]
    precisions = sorted({str(r.get("precision") or "unknown") for r in rows})  # unknown: an older shard
    mixed = len(precisions) > 1
    head = ["model", "step", *(["precision"] if mixed else []), *metrics, "reward/mean", "mean length", "clipped"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"`{r['model']}`", "–" if r.get("step") is None else str(r["step"])]
        cells += [str(r.get("precision") or "unknown")] if mixed else []
        cells += [_fmt(r, m) for m in metrics]
        cells += [_fmt(r, "reward/mean"), f"{r.get('completions/mean_length', 0):.0f}",
                  f"{r.get('completions/clipped_ratio', 0):.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    r0 = rows[0]
    decoding = "greedy (temperature 0)" if r0.get("decoding") == "greedy" else (
        f"temperature {r0.get('temperature')}, top-p {r0.get('top_p')}")
    title = (f"**{r0.get('task')}** ({r0.get('split')} split): {r0.get('problems')} problems, "
             f"{r0.get('num_samples')} sample(s) each, {decoding}, max {r0.get('max_new_tokens')} new tokens, "
             f"seed {r0.get('seed')}, " + (f"precision {precisions[0]}." if not mixed else
             f"**mixed precision** ({', '.join(precisions)}: rows differ by precision as well as by model)."))
    methods = sorted({r[k] for r in rows for k in r if k.startswith("ci_method/")})
    foot = ("95 % intervals in brackets: " + " / ".join(
        {"wilson": "Wilson score where each problem is a 0/1 outcome",
         "bootstrap": "percentile bootstrap over problems (2,000 resamples) otherwise"}[m] for m in methods)
        + "; maj@k: majority vote over extracted answers, ties to the answer given first.")
    return "\n".join([title, "", *lines, "", foot]) + "\n"


def companion_paths(json_path: Path) -> tuple[Path, Path]:
    """The table and per-sample files written beside an evaluation's result JSON: ``X.json`` →
    ``(X.md, X.samples.jsonl)`` (a path without ``.json`` keeps its whole name as the stem)."""
    stem = json_path.with_suffix("") if json_path.suffix == ".json" else json_path
    return stem.with_name(stem.name + ".md"), stem.with_name(stem.name + ".samples.jsonl")


def write_report(rows: Sequence[dict[str, Any]], json_path: Path, md_path: Path,
                 single: dict[str, Any] | None = None) -> None:
    """Write the JSON (``{"rows": [...]}``; with one model, also that model's whole result at the
    top level, as ``rlvr eval`` always wrote) and the Markdown table. Each file is written to a
    temporary name and renamed, so an existing report is never left half-written."""
    payload: dict[str, Any] = dict(single) if single is not None else {}
    payload["rows"] = list(rows)
    write_text_atomic(json_path, json.dumps(payload, indent=2))
    write_text_atomic(md_path, markdown_table(rows))


class SamplesWriter:
    """Per-problem JSONL: one line per (model, problem) with every sample, its extracted answer and
    verdict; lines are flushed as problems finish, so an interrupted evaluation keeps what it did.

    Raises:
        OSError: the file cannot be opened for writing (raised by the constructor, before any model loads).
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh: IO[str] = path.open("w", encoding="utf-8")
        self.model: str | None = None

    def __call__(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps({"model": self.model, **record}) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()
