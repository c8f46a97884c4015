"""The key-fact golds of a set of answers, the trivial answers beside them, and pooled intervals,
for `python -m lit_rlhf.apps.compare_policies` (live and `--rescore`).

Every answer gets the measures of `lit_rlhf.judges.keyfact` (`MEASURES`); with the post's checks
(`bundled:keyfact_checks`) also whether it names a distractor detail or states a listed false
statement. Trivial answers from the post alone (`EXTRACTIVE`: first sentence, title, whole post,
and the reference, the ceiling) stand beside the policy. Seeds are pooled by the hierarchical
bootstrap of `lit_rlhf.evaluation.paired`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from lit_rlhf.evaluation.paired import bootstrap_mean, paired_bootstrap
from lit_rlhf.judges.keyfact import keyfact_f1, keyfact_recall, keyfact_recall_v1, listed_matches

# name -> what it measures (each per answer, averaged over prompts)
MEASURES = {
    "recall_v1": "key-fact recall, the gold of generation time (the bundled pairs' labels; 'gold' of results before the fix)",
    "recall": "key-fact recall, the fixed gold (contractions expanded, Porter's light stemmer)",
    "f1": "key-fact F1: the fixed recall and the precision of the answer's content words",
    "distractor": "1 when the answer names one of the post's distractor details (age, city, years known)",
    "false": "1 when the answer states one of the post's listed false statements",
}
CHECKED = ("distractor", "false")  # the measures that need the post's checks


def first_sentence(text: str) -> str:
    """The text up to and including its first sentence end (".", "!" or "?" before white space or
    the end); the whole stripped text when it has none."""
    text = text.strip()
    match = re.search(r"[.!?](?=\s|$)", text)
    return text[: match.end()] if match else text


# extractive answers, from a post's checks row (id, title, post, summary)
EXTRACTIVE: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "first_sentence": lambda row: first_sentence(row["post"]),
    "title": lambda row: row["title"],
    "post": lambda row: row["post"],
    "reference": lambda row: row["summary"],
}


def load_checks(path: str) -> dict[str, dict[str, Any]]:
    """The checks rows of `path` (`bundled:<name>`: every split of that bundled set; or a .jsonl
    file), keyed by their reference (`summary`), which names the post: one key fact per person x
    situation, each in one split."""
    from lit_rlhf.data.sources import BUNDLED_PREFIX, bundled_aliases

    if path.startswith(BUNDLED_PREFIX):
        name = path[len(BUNDLED_PREFIX):]
        files = bundled_aliases().get(name)
        if not files:
            raise ValueError(f"no bundled dataset {name!r} (available: {sorted(bundled_aliases())})")
        files = list(files.values())
    elif Path(path).is_file():
        files = [path]
    else:
        raise ValueError(f"checks {path!r}: neither bundled:<name> nor a .jsonl file")
    out: dict[str, dict[str, Any]] = {}
    for f in files:
        for i, line in enumerate(Path(f).read_text().splitlines()):
            row = json.loads(line)
            missing = {"summary", "title", "post", "distractors", "false_claims"} - set(row)
            if missing:
                raise ValueError(f"{f} row {i} lacks {sorted(missing)}")
            if row["summary"] in out:
                raise ValueError(f"{f} row {i}: the reference {row['summary']!r} names two posts")
            out[row["summary"]] = row
    return out


def checks_for(references: Sequence[str], checks: Mapping[str, Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The checks row of each reference, in order; a reference without one is an error."""
    missing = [r for r in references if r not in checks]
    if missing:
        raise ValueError(f"{len(missing)} of {len(references)} references have no checks row (first: {missing[0]!r}): "
                         "are the checks those of the evaluation's posts?")
    return [checks[r] for r in references]


def extractive_answers(names: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """{name: one answer per row} for each extractive baseline in `names`."""
    unknown = [n for n in names if n not in EXTRACTIVE]
    if unknown:
        raise ValueError(f"unknown baselines {unknown}: choose from {sorted(EXTRACTIVE)}")
    return {n: [EXTRACTIVE[n](row) for row in rows] for n in names}


def score_answers(answers: Sequence[str], references: Sequence[str],
                  rows: Sequence[Mapping[str, Any]] | None = None) -> dict[str, list[float]]:
    """{measure: one value per answer}: the golds of `MEASURES`; the checked ones only with `rows`."""
    if len(answers) != len(references) or (rows is not None and len(rows) != len(answers)):
        raise ValueError(f"{len(answers)} answers, {len(references)} references"
                         + (f", {len(rows)} checks rows" if rows is not None else ""))
    out = {"recall_v1": [keyfact_recall_v1(a, r) for a, r in zip(answers, references)],
           "recall": [keyfact_recall(a, r) for a, r in zip(answers, references)],
           "f1": [keyfact_f1(a, r) for a, r in zip(answers, references)]}
    if rows is not None:
        out["distractor"] = [float(bool(listed_matches(a, row["distractors"]))) for a, row in zip(answers, rows)]
        out["false"] = [float(bool(listed_matches(a, row["false_claims"]))) for a, row in zip(answers, rows)]
    return out


def pool(per_seed: Sequence[Mapping[str, Mapping[str, Sequence[float]]]], against: Sequence[str] = ("start",),
         policy: str = "trained") -> dict[str, Any]:
    """Means over seeds x prompts with hierarchical bootstrap intervals.

    `per_seed[s][answerer][measure]` holds one value per prompt, the prompts the same in every
    seed. Returns {"answerers": {answerer: {measure: BootstrapMean}}, "differences":
    {f"{policy} - {other}": {measure: paired BootstrapMean}}} for each `other` in `against`."""
    if not per_seed:
        raise ValueError("nothing to pool")
    answerers = list(per_seed[0])
    for s, seed in enumerate(per_seed):
        if list(seed) != answerers:
            raise ValueError(f"seed {s} has answerers {list(seed)}, seed 0 {answerers}")
    grid = {a: {m: [seed[a][m] for seed in per_seed] for m in per_seed[0][a]} for a in answerers}
    out: dict[str, Any] = {"answerers": {a: {m: bootstrap_mean(v).as_dict() for m, v in ms.items()}
                                         for a, ms in grid.items()}, "differences": {}}
    for other in against:
        if other not in grid or policy not in grid:
            raise ValueError(f"cannot pair {policy!r} with {other!r}: answerers are {answerers}")
        out["differences"][f"{policy} - {other}"] = {m: paired_bootstrap(grid[policy][m], grid[other][m]).as_dict()
                                                     for m in grid[policy] if m in grid[other]}
    return out
