"""The measured figures of the README and the documentation pages are rendered from the committed
result files, never typed."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.helpers import REPO_ROOT

spec = importlib.util.spec_from_file_location("render_results", REPO_ROOT / "scripts" / "render_results.py")
render_results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(render_results)


def test_readme_and_pages_match_the_result_files():
    pages = [p for p in render_results.pages() if render_results.blocks_in(p.read_text())]
    assert REPO_ROOT / "README.md" in pages and len(pages) > 1
    for page in pages:
        text = page.read_text()
        assert render_results.render(text) == text, f"{page} is stale: run python scripts/render_results.py"
    assert render_results.main(["--check"]) == 0


def test_every_block_is_shown_on_some_page():
    shown = {name for p in render_results.pages() for name in render_results.blocks_in(p.read_text())}
    assert shown == set(render_results.BLOCKS)
    readme = (REPO_ROOT / "README.md").read_text()
    assert {"quickstart-clean", "recipes"} <= set(render_results.blocks_in(readme))  # the main job's table, every method


def test_a_changed_number_is_caught(tmp_path):
    page = (REPO_ROOT / "docs" / "getting-started.md").read_text()
    results = sorted((REPO_ROOT / "results" / "quickstart").glob("seed*.json"))
    assert results, "no committed quickstart result"
    result = json.loads(results[0].read_text())
    shown = f"{result['reward']['mean_diff']:+.3f}"  # the per-seed table's reward difference
    assert shown in page
    stale = tmp_path / "getting-started.md"
    stale.write_text(page.replace(shown, "9.999", 1))
    assert render_results.main(["--check", "--readme", str(stale)]) == 1
    assert render_results.main(["--readme", str(stale)]) == 0 and stale.read_text() == page


def test_a_changed_number_in_the_readme_is_caught(tmp_path):
    readme = (REPO_ROOT / "README.md").read_text()
    golds = json.loads((REPO_ROOT / "results" / "quickstart" / "golds" / "seeds6-7.json").read_text())
    shown = f"{golds['answerers']['trained']['f1']['mean']:.3f}"
    assert shown in readme
    stale = tmp_path / "README.md"
    stale.write_text(readme.replace(shown, "0.999", 1))
    assert render_results.main(["--check", "--readme", str(stale)]) == 1


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


def read_plainly(text: str) -> str:
    """The "Read plainly" paragraphs of a page (each up to the next blank line)."""
    return "\n\n".join(p for p in text.split("\n\n") if p.startswith("**Read plainly.**") or p.startswith("Read plainly"))


QUICKSTART_FILES = sorted((REPO_ROOT / "results" / "quickstart").rglob("*.json"))


def test_the_read_plainly_numbers_are_in_the_result_files():
    """Every decimal of the main job's "Read plainly" sentences (README, Getting started) is one a
    result file holds (at 2 or 3 decimals), so a sentence cannot state a number its file does not."""
    from tests.helpers import decimals_not_in_files

    for page in (REPO_ROOT / "README.md", REPO_ROOT / "docs" / "getting-started.md"):
        section = read_plainly(page.read_text())
        assert section and decimals_not_in_files(section, [], QUICKSTART_FILES) == [], page
    assert decimals_not_in_files("**Read plainly.** by 0.4321", [], QUICKSTART_FILES) == ["0.4321"]
