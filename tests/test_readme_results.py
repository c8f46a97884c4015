"""The README's measured figures are rendered from the committed result files, never typed."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.helpers import REPO_ROOT

spec = importlib.util.spec_from_file_location("render_results", REPO_ROOT / "scripts" / "render_results.py")
render_results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(render_results)


def test_readme_matches_the_result_files():
    readme = (REPO_ROOT / "README.md").read_text()
    assert render_results.render(readme) == readme, "README is stale: run python scripts/render_results.py"
    assert render_results.main(["--check"]) == 0


def test_a_changed_number_is_caught(tmp_path):
    readme = (REPO_ROOT / "README.md").read_text()
    results = sorted((REPO_ROOT / "results" / "quickstart").glob("seed*.json"))
    assert results, "no committed quickstart result"
    result = json.loads(results[0].read_text())
    shown = f"{result['reward']['mean_diff']:+.3f}"  # the per-seed table's reward difference
    assert shown in readme
    stale = tmp_path / "README.md"
    stale.write_text(readme.replace(shown, "9.999", 1))
    assert render_results.main(["--check", "--readme", str(stale)]) == 1
    assert render_results.main(["--readme", str(stale)]) == 0 and stale.read_text() == readme


def test_every_block_is_present():
    with pytest.raises(ValueError, match="no block"):
        render_results.render("a README without blocks")


def test_the_golds_table_is_rendered_from_the_rescored_answers():
    """Each answerer's pooled golds appear as the rescoring wrote them, baselines beside the policies."""
    path = next(p for p in render_results.GOLD_FILES if (REPO_ROOT / p).is_file())
    golds = json.loads((REPO_ROOT / path).read_text())
    block = render_results.golds_table(golds)
    row = next(line for line in block if line.startswith("| copy the post's first sentence |"))
    assert f"{golds['answerers']['first_sentence']['f1']['mean']:.3f}" in row
    assert any(line.startswith("| **trained - first sentence** (paired) |") for line in block)
