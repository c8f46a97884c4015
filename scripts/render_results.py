"""Render the README's measured figures from the committed result files, or check that they match.

    python scripts/render_results.py            # rewrite the README's generated blocks
    python scripts/render_results.py --check    # exit 1 when the README differs from the files

The README holds generated blocks between `<!-- results:NAME -->` and `<!-- /results:NAME -->`:

- `quickstart`: the main job, from `results/quickstart/seed*.json` (written by
  `scripts/quickstart_report.py`; `scripts/quickstart_seeds.sh` reruns every seed);
- `recipes`: the per-method table, from `results/recipes/*.json` (written by
  `scripts/run_recipes.py`, which runs each quickstart recipe as a new user would).

Nothing in those blocks is typed by hand, so the README cannot drift from what the code measured
(`tests/test_readme_results.py` runs `--check`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_SEED = 1  # the seed configs/quickstart/*.yaml set (seed_everything)
SELECTION_SEED = 0  # the seed settings were chosen on: shown when alone, never counted as evidence


def _ci(d: dict[str, Any], digits: int = 3) -> str:
    return f"[{d['ci_low']:.{digits}f}, {d['ci_high']:.{digits}f}]"


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def _when(result: dict[str, Any]) -> str:
    m = result["machine"]
    load = m.get("load_average_1_5_15") or ["?"]
    return f"{result['created'][:10]}, {m.get('cpus')} CPUs ({m.get('processor')}), load {load[0]} at the end"


def quickstart_block(results: list[dict[str, Any]]) -> str:
    if not results:
        return "No quickstart result is committed yet."
    by_seed = {r["seed"]: r for r in results}
    shipped = by_seed.get(SHIPPED_SEED, results[0])  # the selection seed only when nothing else is committed
    rm, reward, gold, win = shipped["reward_model"], shipped["reward"], shipped["gold"], shipped["gold_win_rate"]
    acc = rm["accuracy"]
    which = "the shipped seed" if shipped["seed"] == SHIPPED_SEED else f"seed {shipped['seed']} (the configs ship seed {SHIPPED_SEED})"
    lines = [
        f"Measured with {which} on {_when(shipped)}, {_minutes(shipped['wall_seconds'])} of wall time for the "
        f"three steps (`results/quickstart/seed{shipped['seed']}.json`). Verdicts (the whole 95% interval on one "
        f"side of zero, or no detectable change): optimised reward **{reward['verdict']}**, gold **{gold['verdict']}**.",
        "",
        "| Figure | Before | After | Difference, 95% CI |",
        "| --- | --- | --- | --- |",
        f"| reward model accuracy on {acc['n']} held-out pairs | | {acc['rate']:.3f} | {_ci(acc)} (Wilson) |",
        f"| optimised reward on {reward['n']} held-out prompts | {reward['mean_before']:.3f} | {reward['mean_after']:.3f} "
        f"| {reward['mean_diff']:+.3f} {_ci(reward)} (paired t) |",
        f"| gold key-fact recall on the same prompts | {gold['mean_before']:.3f} | {gold['mean_after']:.3f} "
        f"| {gold['mean_diff']:+.3f} {_ci(gold)} (paired t) |",
        f"| gold win rate against the starting policy | | {win['rate']:.3f} | {_ci(win)} (Wilson, ties half) |",
    ]
    if "agreement_with_gold" in rm:
        g = rm["agreement_with_gold"]
        lines.insert(-3, f"| reward model agreement with the gold on the {g['n']} of those pairs the gold does not tie "
                         f"| | {g['rate']:.3f} | {_ci(g)} (Wilson) |")
    if shipped.get("ended"):
        e = shipped["ended"]
        lines.append(f"| answers ending with EOS within {shipped['evaluation']['max_new_tokens']} tokens "
                     f"| {e['before']['rate']:.3f} | {e['after']['rate']:.3f} | |")
    seeds = sorted(s for s in by_seed if s != SELECTION_SEED)
    if len(seeds) > 1:
        above = {k: sum(by_seed[s][k]["ci_low"] > 0 for s in seeds) for k in ("reward", "gold")}
        lines += [
            "",
            f"Over seeds {', '.join(map(str, seeds))} the reward's interval lies above zero in "
            f"{above['reward']} of {len(seeds)} runs and the gold's in {above['gold']} of {len(seeds)}:",
            "",
            "| Seed | Reward difference, 95% CI | Gold difference, 95% CI | Gold win rate | Wall time (load at the end) |",
            "| --- | --- | --- | --- | --- |",
        ]
        for s in seeds:
            r = by_seed[s]
            lines.append(f"| {s} | {r['reward']['mean_diff']:+.3f} {_ci(r['reward'])} | {r['gold']['mean_diff']:+.3f} "
                         f"{_ci(r['gold'])} | {r['gold_win_rate']['rate']:.3f} | {_minutes(r['wall_seconds'])} "
                         f"({r['machine']['load_average_1_5_15'][0]}) |")
    return "\n".join(lines)


def _metric(result: dict[str, Any]) -> str:
    parts = []
    for name, m in result["validation"].items():
        first, last = m["first"], m["last"]
        value = f"{last:.3g}" if m["count"] == 1 else f"{first:.3g} -> {last:.3g}"
        parts.append(f"{name} {value}")
    steps = sorted({s for m in result["validation"].values() for s in m["steps"]})
    return ", ".join(parts) + (f" (steps {', '.join(map(str, steps))})" if steps else "")


# the quickstart recipes in the README's order: name -> (label, recipe it needs first, the scalars
# worth a column); scripts/run_recipes.py runs them and writes results/recipes/<name>.json
RECIPES = {
    "sft": ("SFT", None, ("val/loss",)),
    "reward": ("Reward model", None, ("val/rewards/accuracy", "val/rewards/margins")),
    "dpo": ("DPO", None, ("val/loss", "val/rewards/margins", "val/rewards/accuracies")),
    "kto": ("KTO", None, ("val/loss", "val/rewards/margins")),
    "drov": ("DRO-V", None, ("val/loss", "val/value/loss")),
    "ppo": ("PPO", "reward", ("val/objective/scores", "val/objective/kl")),
    "grpo": ("GRPO", "reward", ("train/objective/scores", "train/objective/kl")),
    "remax": ("ReMax", "reward", ("val/objective/scores", "val/objective/kl")),
    "online_dpo": ("Online DPO", "reward", ("val/objective/scores", "val/objective/kl")),
    "rejection_sampling": ("Rejection sampling (best-of-N)", "reward", ("val/objective/scores",)),
    "orpo": ("ORPO", None, ("val/loss", "val/rewards/log_odds_ratio", "val/rewards/accuracies")),
    "ppo_ptx": ("PPO-ptx", "reward", ("val/objective/scores", "val/objective/kl", "train/loss/ptx")),
}


def recipes_block(results: list[dict[str, Any]]) -> str:
    by_config = {r["config"]: r for r in results}
    lines = ["| Method | Command | Needs first | Time (2 cores) | Result (first -> last validation) | Measured |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, (label, needs, _) in RECIPES.items():
        config = f"configs/quickstart/{name}.yaml"
        command = f"| {label} | `python main.py fit --config {config}` | {f'the {needs} recipe' if needs else '-'} | "
        r = by_config.get(config)
        if r is None:
            lines.append(command + "not rerun since the last change | | |")
            continue
        lines.append(command + f"{_minutes(r['wall_seconds'])} | {_metric(r)} | {r['created'][:10]}, load "
                     f"{r['machine']['load_average_1_5_15'][0]} |")
    return "\n".join(lines)


def load(pattern: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(ROOT.glob(pattern))]


BLOCKS = {
    "quickstart": lambda: quickstart_block(load("results/quickstart/seed*.json")),
    "recipes": lambda: recipes_block(load("results/recipes/*.json")),
}


def render(text: str, blocks: dict[str, Any] = BLOCKS) -> str:
    """`text` with every generated block replaced by its rendering from the result files."""
    for name, make in blocks.items():
        pattern = re.compile(rf"(<!-- results:{name} -->\n)(?:.*?\n)?(<!-- /results:{name} -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"the README has no block <!-- results:{name} --> ... <!-- /results:{name} -->")
        body = make()
        text = pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check; exit 1 when the README is stale")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    args = parser.parse_args(argv)
    current = args.readme.read_text()
    wanted = render(current)
    if args.check:
        if wanted != current:
            print(f"error: {args.readme} differs from the committed result files: run python scripts/render_results.py",
                  file=sys.stderr)
            return 1
        return 0
    args.readme.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
