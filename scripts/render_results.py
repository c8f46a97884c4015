"""Render the measured figures of the README and the documentation pages from the committed
result files, or check that they match.

    python scripts/render_results.py            # rewrite the generated blocks of every page
    python scripts/render_results.py --check    # exit 1 when a page differs from the files

The README and the pages under `docs/` hold generated blocks between `<!-- results:NAME -->` and
`<!-- /results:NAME -->`:

- `quickstart`: the main job, from `results/quickstart/seed*.json` (written by
  `scripts/quickstart_report.py`; `scripts/quickstart_seeds.sh` reruns every seed) and the golds
  of their saved answers beside the trivial answers, `results/quickstart/golds/*.json` (written by
  `python -m lit_rlhf.apps.compare_policies --rescore`); `quickstart-clean` is its first table
  alone (the seeds run after the last choice), for the README; `quickstart-selection` the KL
  coefficient's choice on the validation posts and `quickstart-long` the longer profile against
  its goal (`scripts/render_quickstart.py` renders the main job's blocks);
- `recipes`: the per-method table, from `results/recipes/*.json` (written by
  `scripts/run_recipes.py`, which runs each quickstart recipe as a new user would), and
  `recipe-NAME` one recipe's row of it, for its method's page;
- `verifiable_math`: the verifiable-reward example's before/after table, from
  `examples/results/verifiable_math/results.json` (written by `examples/verifiable_math.py`);
- `verifiable_pass_at_k`: the same example's sampled accuracy before and after (avg@k, pass@k,
  maj@k), from `examples/results/verifiable_math/pass_at_k.json` (written by
  `python -m lit_rlhf.apps.pass_at_k`);
- `envs`: the environment recipes' held-out comparisons, from `results/envs/*.json` (written by
  `python -m lit_rlhf.apps.compare_env_policies`).

Every block is shown somewhere, and nothing in a block is typed by hand, so no page can drift from
what the code measured (`tests/test_readme_results.py` runs `--check`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded from its file by the tests
from render_quickstart import (GOLD_FILES, golds, golds_table, long_block, quickstart_block,  # noqa: E402,F401
                               quickstart_clean_block, selection_block)
from render_quickstart import minutes as _minutes  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
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
    # the teacher is the student's own base given a privileged context: no recipe first
    "distill": ("On-policy distillation", None, ("val/distill/reverse_kl",)),
    # the annotator is a programmatic key-fact reward: no recipe first
    "xpo": ("XPO", None, ("val/objective/scores", "val/objective/kl")),
    "listwise_dpo": ("Listwise DPO (Plackett-Luce, lists of 4)", None,
                     ("val/loss", "val/rewards/margins", "val/rewards/top1")),
}


def recipes_block(results: list[dict[str, Any]], only: str | None = None) -> str:
    """The quickstart recipes' table; `only`: that recipe's row alone (under the same header)."""
    by_config = {r["config"]: r for r in results}
    lines = ["| Method | Command | Needs first | Time (2 cores) | Result (first -> last validation) | Measured |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, (label, needs, _) in RECIPES.items():
        if only is not None and name != only:
            continue
        config = f"configs/quickstart/{name}.yaml"
        command = f"| {label} | `python main.py fit --config {config}` | {f'the {needs} recipe' if needs else '-'} | "
        r = by_config.get(config)
        if r is None:
            lines.append(command + "not rerun since the last change | | |")
            continue
        lines.append(command + f"{_minutes(r['wall_seconds'])} | {_metric(r)} | {r['created'][:10]}, load "
                     f"{r['machine']['load_average_1_5_15'][0]} |")
    return "\n".join(lines)


VERIFIABLE_MATH = "examples/results/verifiable_math/results.json"


def verifiable_math_block(result: dict[str, Any]) -> str:
    """The example's greedy accuracy before and after training, with the paired rise's interval."""
    low, high = result["rise_95ci"]
    return "\n".join(["| split | n | greedy accuracy before | after | rise | 95% interval of the rise |",
                      "| --- | --- | --- | --- | --- | --- |",
                      f"| test (held out) | {result['n']} | {result['before']:.3f} | {result['after']:.3f} | "
                      f"{result['rise']:+.3f} | [{low:+.3f}, {high:+.3f}] |"])


VERIFIABLE_PASS_AT_K = "examples/results/verifiable_math/pass_at_k.json"


def pass_at_k_block(result: dict[str, Any]) -> str:
    """Sampled accuracy of two policies on the same problems: each metric with its bootstrap
    interval over problems, and the paired difference after - before."""
    settings = result["settings"]

    def cell(s: dict[str, Any], sign: str = "") -> str:
        return f"{s['mean']:{sign}.3f} [{s['ci_low']:{sign}.3f}, {s['ci_high']:{sign}.3f}]"

    lines = [f"{settings['num_problems_used']} held-out problems (`{settings['split']}`), n = {settings['n']} samples each "
             f"at temperature {settings['temperature']}, up to {settings['max_new_tokens']} new tokens, seed "
             f"{settings['seed']}; 95% bootstrap intervals over problems ({settings['num_resamples']} resamples); "
             f"measured {result['created'][:10]} ({result['seconds']:.0f} s, load {result['machine']['load_average_1_5_15'][0]}).",
             "",
             f"| metric | before (`{settings['before']}`) | after (`{settings['after']}`) | after - before |",
             "| --- | --- | --- | --- |"]
    for metric in result["metrics"]:
        before, after = result["summary"]["before"][metric], result["summary"]["after"][metric]
        lines.append(f"| {metric} | {cell(before)} | {cell(after)} | {cell(result['difference'][metric], '+')} |")
    return "\n".join(lines)


# the environment recipes' held-out comparisons (`python -m lit_rlhf.apps.compare_env_policies`): file -> what
# was compared
ENV_FILES = {"results/envs/arithmetic_calculator_sft.json": "SmolLM2 -> SFT on 64 demonstrations",
             "results/envs/arithmetic_calculator_grpo.json": "cold start (8 demonstrations) -> GRPO"}


def envs_block(results: dict[str, dict[str, Any]]) -> str:
    """Accuracy and working tool calls before and after, paired, per compared pair of policies."""
    lines = ["| Policies (before -> after) | n | Accuracy before -> after | Paired difference, 95% CI | Sign test (+/-) "
             "| Episodes with a working call | Measured |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for path, label in ENV_FILES.items():
        if path not in results:
            continue
        r = results[path]
        d, sign = r["rewards"]["MathAnswerReward"]["difference"], r["rewards"]["MathAnswerReward"]["sign_test"]
        calls = r["tool_use"]["episodes_with_a_working_call"]
        lines.append(f"| {label} (`{path}`) | {d['n']} | {d['mean_before']:.2f} -> {d['mean_after']:.2f} | "
                     f"{d['mean_diff']:+.2f} [{d['ci_low']:.2f}, {d['ci_high']:.2f}] | {sign['positive']} / "
                     f"{sign['negative']} | {calls['before']['rate']:.2f} -> {calls['after']['rate']:.2f} | "
                     f"{r['created'][:10]}, load {r['machine']['load_average_1_5_15'][0]} |")
    return "\n".join(lines)


def load(pattern: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(ROOT.glob(pattern))]


BLOCKS = {
    "quickstart": lambda: quickstart_block(load("results/quickstart/seed*.json"), golds()),
    "quickstart-clean": lambda: quickstart_clean_block(golds()),
    "quickstart-selection": lambda: selection_block(ROOT / "results/quickstart/selection/validation.json"),
    "quickstart-long": lambda: long_block(ROOT / "results/quickstart/long"),
    "recipes": lambda: recipes_block(load("results/recipes/*.json")),
    **{f"recipe-{name}": (lambda name=name: recipes_block(load("results/recipes/*.json"), only=name))
       for name in RECIPES},
    "verifiable_math": lambda: verifiable_math_block(json.loads((ROOT / VERIFIABLE_MATH).read_text())),
    "verifiable_pass_at_k": lambda: pass_at_k_block(json.loads((ROOT / VERIFIABLE_PASS_AT_K).read_text())),
    "envs": lambda: envs_block({p: json.loads((ROOT / p).read_text()) for p in ENV_FILES if (ROOT / p).is_file()}),
}


def pages() -> list[Path]:
    """The README and every documentation page."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- results:{re.escape(name)} -->\n)(?:.*?\n)?(<!-- /results:{re.escape(name)} -->)", re.S)


def blocks_in(text: str, blocks: dict[str, Any] = BLOCKS) -> list[str]:
    return [name for name in blocks if _pattern(name).search(text)]


def render(text: str, blocks: dict[str, Any] = BLOCKS) -> str:
    """`text` with every generated block it holds replaced by its rendering from the result files."""
    names = blocks_in(text, blocks)
    if not names:
        raise ValueError("the page has no block <!-- results:NAME --> ... <!-- /results:NAME --> "
                         f"(NAME one of {', '.join(blocks)})")
    for name in names:
        body = blocks[name]()
        text = _pattern(name).sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check; exit 1 when a page is stale")
    parser.add_argument("--readme", type=Path, default=None,
                        help="one page to render or check (default: the README and every page under docs/)")
    args = parser.parse_args(argv)
    targets = [args.readme] if args.readme else [p for p in pages() if blocks_in(p.read_text())]
    if args.readme is None:
        shown = {name for p in targets for name in blocks_in(p.read_text())}
        missing = [name for name in BLOCKS if name not in shown]
        if missing:
            print(f"error: no page shows the blocks {', '.join(missing)}", file=sys.stderr)
            return 1
    stale = 0
    for path in targets:
        current = path.read_text()
        wanted = render(current)
        if wanted == current:
            continue
        if args.check:
            print(f"error: {path} differs from the committed result files: run python scripts/render_results.py",
                  file=sys.stderr)
            stale += 1
        else:
            path.write_text(wanted)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
