"""benchmarks/default_seeds_table.py: per-seed table, 95 % t-intervals and paired differences
(hand-computed values)."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "default_seeds_table", Path(__file__).resolve().parents[2] / "benchmarks" / "default_seeds_table.py")
dst = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(dst)


def _write(folder: Path, arm: str, seed: int, p1: float, **kw) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{arm}.seed{seed}.result.json").write_text(json.dumps(
        {"eval/pass@1": p1, "eval/pass@4": kw.get("p4", 0.5), "tokens": kw.get("tokens", 100), "wall_s": 10.0}))


def test_later_folder_wins_and_paired_differences(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    for s, v in enumerate([0.1, 0.2, 0.3]):
        _write(old, "grpo", s, v)
    _write(new, "grpo", 0, 0.4)  # a rerun of GRPO seed 0 replaces the old one
    for s, v in enumerate([0.5, 0.3, 0.4]):
        _write(new, "mu_grpo", s, v)
    res = dst.load_results([old, new])
    assert res[("grpo", 0)]["eval/pass@1"] == 0.4 and res[("grpo", 1)]["eval/pass@1"] == 0.2
    md = dst.table(res, ["grpo", "mu_grpo"], "grpo")
    # grpo 0.4, 0.2, 0.3: mean 0.3, s = 0.1, half = 4.303 * 0.1 / sqrt(3) = 0.248
    assert "| grpo | 0.400 | 0.200 | 0.300 | 0.300 ± 0.248 |" in md
    # differences 0.1, 0.1, 0.1: mean +0.1, s = 0 → half 0; all three above
    assert "| mu_grpo | +0.100 | +0.100 | +0.100 | +0.100 ± 0.000 | 3 of 3 |" in md


def test_one_seed_has_no_interval_and_missing_folder_is_named(tmp_path):
    _write(tmp_path, "grpo", 0, 0.25)
    md = dst.table(dst.load_results([tmp_path]), ["grpo"], "grpo")
    assert "0.250 (1 seed)" in md
    with pytest.raises(FileNotFoundError, match="nope"):
        dst.load_results([tmp_path / "nope"])
    assert math.isinf(dst.t_interval([0.25])[1])
