"""The main job's figures (`scripts/quickstart.sh`) for `scripts/render_results.py`: the clean and
the development seeds' golds beside the trivial answers, the per-seed table, the KL coefficient's
selection on the validation posts and the longer profile against its goal; and the number
formatting every block shares.

- `results/quickstart/seed*.json` (written by `scripts/quickstart_report.py`; `scripts/quickstart_seeds.sh`
  reruns seeds) and `results/quickstart/golds/*.json` (the golds of their saved answers,
  `python -m lit_rlhf.apps.compare_policies --rescore`);
- `results/quickstart/selection/validation.json` (`scripts/quickstart_select.py`);
- `results/quickstart/long/` (`QUICKSTART_PROFILE=long bash scripts/quickstart_seeds.sh`: each seed's
  results.json and the golds of their saved answers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

SHIPPED_SEED = 1  # the seed configs/quickstart/*.yaml set (seed_everything)
SELECTION_SEED = 0  # the seed settings were chosen on: shown when alone, never counted as evidence


def _ci(d: dict[str, Any], digits: int = 3) -> str:
    return f"[{d['ci_low']:.{digits}f}, {d['ci_high']:.{digits}f}]"


def minutes(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


# the key-fact golds of saved answers (`python -m lit_rlhf.apps.compare_policies --rescore ...`): file -> what
# its seeds are. Seeds 1-5 were scored on the test posts while settings were still chosen on them;
# seeds 6 and 7 ran after the last choice and were evaluated once.
GOLD_FILES = {"results/quickstart/golds/seeds6-7.json": "clean",
              "results/quickstart/golds/seeds1-5.json": "test posts used for choices"}
ANSWERERS = {"start": "start (SmolLM2-135M-Instruct)", "trained": "trained (GRPO)",
             "first_sentence": "copy the post's first sentence", "title": "copy the title", "post": "copy the whole post",
             "reference": "the reference key fact"}
MEASURE_LABELS = {"recall_v1": "Recall, generation-time gold", "recall": "Recall, fixed gold", "f1": "Key-fact F1",
                  "distractor": "Names a distractor", "false": "States a listed falsehood"}


def _mean_ci(d: dict[str, Any], sign: bool = False) -> str:
    return f"{d['mean']:{'+' if sign else ''}.3f} {_ci(d)}"


def _table_head(measures: list[str]) -> list[str]:
    return ["| Answer | " + " | ".join(MEASURE_LABELS[m] for m in measures) + " |", "| --- |" + " --- |" * len(measures)]


def _measure_row(label: str, row: dict[str, Any], measures: list[str], sign: bool = False) -> str:
    return f"| {label} | " + " | ".join(_mean_ci(row[m], sign=sign) for m in measures) + " |"


def golds_table(golds: dict[str, Any]) -> list[str]:
    """Answerers x measures (pooled means with intervals), then the trained policy's differences."""
    measures = [m for m in MEASURE_LABELS if m in golds["answerers"]["start"]]
    lines = _table_head(measures)
    for name, row in golds["answerers"].items():
        lines.append(_measure_row(ANSWERERS.get(name, name), row, measures))
    for name in ("trained - start", "trained - first_sentence"):
        if name in golds["differences"]:
            label = "trained - start" if name == "trained - start" else "trained - first sentence"
            lines.append(_measure_row(f"**{label}** (paired)", golds["differences"][name], measures, sign=True))
    return lines


def _seeds(golds: dict[str, Any]) -> str:
    return ", ".join(str(i["seed"]) for i in golds["inputs"])


def golds_section(path: str, kind: str, g: dict[str, Any]) -> list[str]:
    """One gold file's heading line and table."""
    n = g["answerers"]["trained"]["f1"]
    head = (f"**Seeds {_seeds(g)}: {kind}**" if kind == "clean" else f"Seeds {_seeds(g)} ({kind})")
    return [f"{head}: golds of the saved answers (`{path}`), means over {n['num_seeds']} seeds x "
            f"{n['num_prompts']} held-out posts with 95% hierarchical bootstrap intervals (seeds, then posts; "
            "the baselines are one answer per post):", "", *golds_table(g)]


def quickstart_clean_block(golds: dict[str, dict[str, Any]]) -> str:
    """The clean seeds' table alone (the README's summary of the main job)."""
    for path, kind in GOLD_FILES.items():
        if kind == "clean" and path in golds:
            return "\n".join(golds_section(path, kind, golds[path]))
    return "No clean quickstart result is committed yet."


def quickstart_block(results: list[dict[str, Any]], golds: dict[str, dict[str, Any]] | None = None) -> str:
    if not results:
        return "No quickstart result is committed yet."
    golds = golds or {}
    by_seed = {r["seed"]: r for r in results}
    shipped = by_seed.get(SHIPPED_SEED, results[0])
    lines: list[str] = []
    for path, kind in GOLD_FILES.items():
        if path in golds:
            lines += [*golds_section(path, kind, golds[path]), ""]
    rm = shipped["reward_model"]
    acc = rm["accuracy"]
    agree = rm.get("agreement_with_gold")
    lines.append(f"The reward model (shipped seed {shipped['seed']}) orders {acc['rate']:.3f} {_ci(acc)} of the "
                 f"{acc['n']} held-out pairs as their noisy labels do"
                 + (f" and {agree['rate']:.3f} {_ci(agree)} of the {agree['n']} the generation-time gold does not tie "
                    "as that gold does" if agree else "") + ". Per seed (the optimised reward from each run's file; the "
                 "golds rescored as above):")
    lines += ["", "| Seed | Reward difference, 95% CI (paired t) | Answers ending with EOS (start, trained) | Recall, fixed "
                  "| F1 | Distractor | Listed falsehood | Wall time (load at the end) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    per_seed = {}
    for path in GOLD_FILES:
        if path in golds:
            for i, row in zip(golds[path]["inputs"], golds[path]["per_seed"]):
                per_seed[i["seed"]] = row["trained"]
    for s in sorted(by_seed):
        if s == SELECTION_SEED:
            continue
        r, t = by_seed[s], per_seed.get(s)
        cells = [f"{t[m]:.3f}" for m in ("recall", "f1", "distractor", "false")] if t else ["not rescored"] * 4
        ended = f"{r['ended']['before']['rate']:.3f}, {r['ended']['after']['rate']:.3f}" if r.get("ended") else ""
        lines.append(f"| {s} | {r['reward']['mean_diff']:+.3f} {_ci(r['reward'])} | {ended} | " + " | ".join(cells)
                     + f" | {minutes(r['wall_seconds'])} ({r['machine']['load_average_1_5_15'][0]}) |")
    live = [r for r in results if r.get("answerers") and "reward" in r["answerers"].get("start", {})]
    if live:
        r = live[-1]
        lines += ["", f"The optimised reward of every answer in seed {r['seed']}'s evaluation (an extractive answer "
                      "scored as an answer that ended; 95% bootstrap intervals over posts): "
                  + ", ".join(f"{ANSWERERS.get(a, a)} {m['reward']['mean']:+.3f} {_ci(m['reward'])}"
                              for a, m in r["answerers"].items()) + "."]
    return "\n".join(lines)


def golds() -> dict[str, dict[str, Any]]:
    """The committed gold files of `GOLD_FILES` that exist, by path."""
    return {p: json.loads((ROOT / p).read_text()) for p in GOLD_FILES if (ROOT / p).is_file()}


def selection_block(path: Path) -> str:
    """The KL coefficient's choice on the validation posts (`scripts/quickstart_select.py`)."""
    if not path.is_file():
        return "The selection on the validation posts has not been run yet (`python scripts/quickstart_select.py`)."
    r = json.loads(path.read_text())
    measures = [m for m in ("recall", "f1", "distractor", "false") if m in r["answerers"]["start"]]
    arms = [f"kl_coef {v:g}" for v in r["values"]]
    n = r["answerers"][arms[0]]["f1"]
    lines = [f"Selection on the validation posts (`{path.relative_to(ROOT)}`, {r['created'][:10]}): seeds "
             f"{', '.join(map(str, r['seeds']))} x {n['num_prompts']} posts, means with 95% hierarchical bootstrap "
             f"intervals. Rule, fixed before the run: {r['rule']}.", "", *_table_head(measures)]
    for name in [*arms, "start", "first_sentence"]:
        lines.append(_measure_row(f"trained, {name}" if name in arms else ANSWERERS.get(name, name),
                                  r["answerers"][name], measures))
    diff = f"{arms[0]} - {arms[1]}"
    if len(arms) == 2 and diff in r["differences"]:
        lines.append(_measure_row(f"**{diff}** (paired)", r["differences"][diff], measures, sign=True))
    runs = ", ".join(f"seed {i['seed']} {i['kl_coef']:g} {minutes(i['wall_seconds'])} (load {i['load_average_1_5_15'][0]})"
                     for i in r["inputs"])
    lines += ["", f"**Chosen: kl_coef {r['chosen']:g}** (F1 " + ", ".join(f"{a} {v:.3f}" for a, v in r["f1"].items())
              + f"); the shipped value is {r['shipped']:g}"
              + (", so the shipped setting stands." if r["chosen_is_shipped"] else ", so the recipe changes.")
              + f" Runs (wall time, the second of a seed without its reward model): {runs}."]
    return "\n".join(lines)


GOAL = "trained - first_sentence"


def long_block(folder: Path) -> str:
    """The longer profile's result on the test posts against its goal, stated before it ran: beat copying
    the post's first sentence on the key-fact F1 (the paired interval above 0)."""
    files = sorted(folder.glob("seed*.json")) if folder.is_dir() else []
    gold_path = folder / "golds.json"
    if not files or not gold_path.is_file():
        return "The longer profile has not been run yet (`QUICKSTART_PROFILE=long bash scripts/quickstart_seeds.sh 10 11`)."
    runs = [json.loads(f.read_text()) for f in files]
    g = json.loads(gold_path.read_text())
    f1 = g["differences"][GOAL]["f1"]
    verdict = "met" if f1["ci_low"] > 0 else "failed" if f1["ci_high"] < 0 else "not shown"
    lines = golds_section(str(gold_path.relative_to(ROOT)), "longer profile, seeds never used for a choice", g)
    lines += ["", f"**Goal, beat copying the first sentence on the key-fact F1: {verdict}** (trained - first "
              f"sentence {_mean_ci(f1, sign=True)}). " + "; ".join(
                  f"seed {r['seed']}: {r['training']['rollouts']} rollouts of {r['grpo'].get('batch_size')} posts x "
                  f"{r['grpo'].get('num_generations')} answers, kl_coef {r['grpo'].get('kl_coef')}, reward difference "
                  f"{r['reward']['mean_diff']:+.3f} {_ci(r['reward'])}, KL to the start at the end "
                  f"{r['training']['train_kl_last']:.2f}, {minutes(r['wall_seconds'])} (load "
                  f"{r['machine']['load_average_1_5_15'][0]} at the end, {r['created'][:10]})" for r in runs) + "."]
    return "\n".join(lines)
