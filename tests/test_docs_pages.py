"""The guide pages say only what the code does: every error message the troubleshooting page quotes
is one the code raises, every metric the metrics page names is one a module logs, and every
recipe a page names exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

DOCS = REPO_ROOT / "docs"
SOURCES = [*sorted((REPO_ROOT / "lit_rlhf").rglob("*.py")), *sorted((REPO_ROOT / "callbacks").rglob("*.py"))]


def words(text: str) -> list[str]:
    return re.findall(r"[a-z_]+", text.lower())


def code_text() -> str:
    """The words of lit_rlhf's and callbacks' source, one space apart (so a message split over
    several string literals, or filled in by an f-string, still reads as its words in order)."""
    return " " + " ".join(w for path in SOURCES for w in words(path.read_text())) + " "


CODE = code_text()
SOURCE = "\n".join(path.read_text() for path in SOURCES)


def text_blocks(page: Path) -> list[str]:
    return [b.strip() for b in re.findall(r"^```text\n(.*?)^```", page.read_text(), re.S | re.M)]


def share_in_code(message: str) -> float:
    """The share of the message's runs of three words that occur in the code in that order: what a
    run fills in (names, numbers, paths) breaks a few runs, an invented sentence breaks them all."""
    found = words(re.sub(r"^error: (\w+: )?", "", message))
    runs = [" " + " ".join(found[i:i + 3]) + " " for i in range(len(found) - 2)]
    return sum(run in CODE for run in runs) / max(len(runs), 1)


@pytest.mark.parametrize("message", text_blocks(DOCS / "troubleshooting.md"), ids=lambda m: m[:40])
def test_every_quoted_error_is_the_codes(message):
    # three messages are mostly filled in: jsonargparse's and datasets' words, or the names near a typo
    composed = any(s in message for s in ("Parser key", "Couldn't reach", "did you mean"))
    assert share_in_code(message) >= (0.2 if composed else 0.5), f"not a message of the code: {message!r}"


def test_the_quote_check_rejects_an_invented_message():
    assert share_in_code("error: ValueError: num_generations must be >= 2 (advantages are relative to the group), "
                         "got 1") == 1.0
    assert share_in_code("error: GRPO diverged because its advantages exploded; lower beta and retry") < 0.2


METRIC = re.compile(r"`(?:train|val|test)/([\w/<>]+)`")


def test_every_metric_named_on_the_metrics_page_is_logged():
    names = set(METRIC.findall((DOCS / "metrics.md").read_text()))
    assert len(names) >= 40
    missing = []
    for name in sorted(names):
        if name in ("loss",):  # `{stage}/loss`, logged by name
            continue
        template = re.escape(name).replace("<name>", r"\{\w+\}")
        reward_source = name.startswith("rewards/") and re.search(rf"[\"']{name[8:]}[\"']", SOURCE)  # rewards/{name}
        if not re.search(rf"[\"'/]{template}[\"']", SOURCE) and not reward_source:
            missing.append(name)
    assert not missing, f"metrics the page names and no module logs: {missing}"


RECIPE = re.compile(r"`((?:configs|examples)/[\w/.-]+\.yaml)`")


@pytest.mark.parametrize("page", ["choosing.md", "metrics.md", "python-quickstart.md", "dataset-formats.md",
                                  "troubleshooting.md"])
def test_every_recipe_named_exists(page):
    named = RECIPE.findall((DOCS / page).read_text())
    missing = [path for path in named if not (REPO_ROOT / path).is_file()]
    assert not missing, f"docs/{page} names recipes that do not exist: {missing}"


def test_the_chooser_covers_every_quick_recipe():
    named = set(RECIPE.findall((DOCS / "choosing.md").read_text()))
    quick = {f"configs/quickstart/{p.name}" for p in (REPO_ROOT / "configs" / "quickstart").glob("*.yaml")}
    assert quick - named <= {"configs/quickstart/judge.yaml", "configs/quickstart/grpo_rubric.yaml"}


@pytest.mark.parametrize("package", ["lit_rlhf.losses", "lit_rlhf.modules"])
def test_the_api_reference_lists_every_export(package):
    """The loss and module pages list their objects one by one (a page per family): a new export
    must be put on one of them."""
    import importlib

    listed = {m.group(1) for page in (DOCS / "reference").glob("*.md")
              for m in re.finditer(rf"^::: {re.escape(package)}\.(\w+)$", page.read_text(), re.M)}
    missing = set(importlib.import_module(package).__all__) - listed
    assert not missing, f"exports of {package} on no page of docs/reference/: {sorted(missing)}"
