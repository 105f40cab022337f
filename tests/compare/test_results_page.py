"""The replication results pages match what `python -m rlvr.compare.results_page` regenerates from the committed
per-run files (issue 38: a stale Holm value on the page is a failing test, not a reader's discovery)."""

from __future__ import annotations

from pathlib import Path

from rlvr.compare import results_page

ROOT = Path(__file__).resolve().parents[2]


def test_committed_results_pages_match_the_per_run_files():
    stale = results_page.check(ROOT)
    assert stale == [], f"regenerate with `PYTHONPATH=src python -m rlvr.compare.results_page`: {stale}"


def test_check_notices_an_edited_number(tmp_path):
    """The check reads the page it is given: a hand-edited Holm value inside a generated block is found."""
    import shutil

    for rel in {p for e in results_page.TABLES.values() for p in e[:2]} | set(results_page.PAGES):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    (tmp_path / "docs/results/replication").mkdir(parents=True, exist_ok=True)
    for runs in ("prereg", "v4"):  # the per-run results the claims files read
        (tmp_path / "docs/results/replication" / runs).symlink_to(ROOT / "docs/results/replication" / runs)
    for rel in {e[1] for e in results_page.TABLES.values()}:
        shutil.copy((ROOT / rel).with_suffix(".json"), (tmp_path / rel).with_suffix(".json"))
    for png in (ROOT / "docs/results").glob("replication_prereg*.png"):  # figure lines are written when they exist
        shutil.copy(png, tmp_path / "docs/results" / png.name)
    assert results_page.check(tmp_path) == []
    page = tmp_path / "docs/results/replication.md"
    text = page.read_text()
    assert "Holm 0.009" in text
    page.write_text(text.replace("Holm 0.009", "Holm 0.002", 1))
    assert results_page.check(tmp_path) == ["docs/results/replication.md"]


def test_tuning_block_reads_the_committed_tuning_runs(tmp_path):
    """A ``tuning:NAME`` block is the mean tuning pass@1 per arm and rate, the best rate in bold (ties to the
    smaller rate), and a missing folder is an error that names it."""
    import json

    import pytest

    folder = tmp_path / results_page.TUNING_ROOT / "t"
    vals = {("a", "1e-4"): [0.5, 0.7], ("a", "3e-4"): [0.6, 0.6], ("b", "1e-4"): [0.2, 0.4], ("b", "3e-4"): [0.1, 0.1]}
    for (arm, lr), v in vals.items():
        for seed, x in enumerate(v):
            d = folder / f"{arm}_lr{lr}" / f"seed{seed}"
            d.mkdir(parents=True)
            (d / "result.json").write_text(json.dumps({"arm": f"{arm}_lr{lr}", "seed": seed, "eval/pass@1": x}))
    md = results_page.tuning_md(tmp_path, "t")
    assert "| `a` | **0.600** | 0.600 | 1e-4 |" in md  # a tie: the smaller rate
    assert "| `b` | **0.300** | 0.100 | 1e-4 |" in md
    with pytest.raises(FileNotFoundError, match="tuning:nope"):
        results_page.tuning_md(tmp_path, "nope")
