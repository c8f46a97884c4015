"""Collect what the quickstart measured into one results file, and print it.

    python scripts/quickstart_report.py outputs/quickstart [--seconds N]

Reads step 3's paired comparison (`<out>/comparison.json`, written by
`python -m lit_rlhf.apps.compare_policies`) and the TensorBoard event files of steps 1 and 2 (the same
numbers TensorBoard shows), writes `<out>/results.json` (settings, date, machine and load, every
figure with its interval, and the per-prompt samples) and prints the report. The README's
main-job figures are rendered from such files committed under `results/quickstart/`
(`python scripts/render_results.py`).

When the paired 95% interval of the optimised reward or of the gold does not lie above zero the
report says so plainly; with `--strict` the exit status is then 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from lit_rlhf.evaluation.logs import read_scalars as scalars


def series(values: dict[str, list[tuple[int, float]]], tag: str) -> list[float]:
    return [v for _, v in values.get(tag, [])]


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def collect(out: Path, seconds: int | None) -> dict[str, Any]:
    comparison = json.loads((out / "comparison.json").read_text())
    reward_logs, grpo_logs = scalars(out / "reward"), scalars(out / "grpo")
    config = yaml.safe_load((out / "grpo" / "config.yaml").read_text()) if (out / "grpo" / "config.yaml").is_file() else {}
    scores = series(grpo_logs, "train/objective/scores")
    window = max(1, len(scores) // 4)
    kl = series(grpo_logs, "train/objective/kl")
    eos = series(grpo_logs, "train/response/eos_fraction")
    grpo = (config.get("model") or {}).get("init_args") or {}
    return {
        "created": comparison["created"],
        "machine": comparison["machine"],
        "seed": config.get("seed_everything"),
        "wall_seconds": seconds,
        # step 2's settings as the run resolved them (a profile or an override changes them)
        "grpo": {k: grpo.get(k) for k in ("kl_coef", "total_episodes", "num_generations", "lr", "temperature",
                                          "max_new_tokens")} | {"batch_size": (config.get("data") or {}).get(
                                              "init_args", {}).get("batch_size")},
        "reward_model": {**comparison.get("reward_model", {}),
                         "val_accuracy_logged": (series(reward_logs, "val/rewards/accuracy") or [None])[-1]},
        "training": {"rollouts": len(scores),
                     "train_scores_first_quarter": mean(scores[:window]),
                     "train_scores_last_quarter": mean(scores[-window:]),
                     "train_kl_last": kl[-1] if kl else None,
                     "eos_fraction_mean": mean(eos)},
        "reward": comparison["reward"],
        "gold": comparison["gold"],
        "gold_win_rate": comparison["gold_win_rate"],
        "ended": comparison.get("ended"),
        "evaluation": {k: comparison["settings"].get(k) for k in ("prompts", "split", "num_prompts", "max_new_tokens",
                                                                  "gold", "missing_eos_score", "checks", "baselines")},
        "timings": comparison.get("timings"),
        # the key-fact golds of the start, the trained policy and the trivial answers (compare_policies --checks)
        **{k: comparison[k] for k in ("answerers", "differences", "per_prompt") if k in comparison},
        "samples": comparison["samples"],
    }


def interval(d: dict[str, Any], digits: int = 3) -> str:
    return f"[{d['ci_low']:.{digits}f}, {d['ci_high']:.{digits}f}]"


def report(results: dict[str, Any], out: Path) -> list[str]:
    rm, reward, gold, win = results["reward_model"], results["reward"], results["gold"], results["gold_win_rate"]
    acc = rm.get("accuracy")
    lines = [
        "=" * 78,
        "lit_rlhf quickstart: SmolLM2-135M-Instruct, bundled keyfact chat data, CPU",
        "=" * 78,
        f"TensorBoard logs      tensorboard --logdir {out}",
        f"reward model (HF)     {out}/reward_model   (AutoModelForSequenceClassification)",
        f"policy (HF)           {out}/policy         (AutoModelForCausalLM)",
        f"results               {out}/results.json   (every figure, and each prompt's completions)",
        "-" * 78,
    ]
    if acc:
        lines.append(f"reward model          held-out pair accuracy {acc['rate']:.3f}, 95% CI {interval(acc)}, "
                     f"n={acc['n']}")
    if "agreement_with_gold" in rm:
        g = rm["agreement_with_gold"]
        lines.append(f"                      agreement with the gold {g['rate']:.3f}, 95% CI {interval(g)}, n={g['n']} "
                     "(pairs the gold does not tie)")
    n = reward["n"]
    lines += [
        f"optimised reward      {reward['mean_before']:.3f} -> {reward['mean_after']:.3f} on {n} held-out prompts, "
        f"paired difference {reward['mean_diff']:+.3f}, 95% CI {interval(reward)}: {reward['verdict']}",
        f"gold (key fact)       {gold['mean_before']:.3f} -> {gold['mean_after']:.3f}, paired difference "
        f"{gold['mean_diff']:+.3f}, 95% CI {interval(gold)}: {gold['verdict']}",
        f"gold win rate         {win['rate']:.3f} vs the starting policy (ties half), 95% CI {interval(win)}, n={win['n']}",
    ]
    if results.get("answerers"):
        lines.append("key-fact golds        " + "  ".join(f"{m}" for m in results["answerers"]["start"]))
        for name, measures in results["answerers"].items():
            lines.append(f"  {name:<19} " + "  ".join(f"{v['mean']:.3f}" for v in measures.values()))
    if results.get("ended"):
        before, after = results["ended"]["before"], results["ended"]["after"]
        lines.append(f"ended with EOS        {before['rate']:.0%} -> {after['rate']:.0%} of the held-out answers")
    t = results["training"]
    if t["train_kl_last"] is not None:
        lines.append(f"training              {t['rollouts']} rollouts, KL to the start {t['train_kl_last']:.3f}, "
                     f"responses ending with EOS {t['eos_fraction_mean'] or 0:.0%}")
    if results["wall_seconds"] is not None:
        s = results["wall_seconds"]
        lines.append(f"wall time             {s // 60} min {s % 60} s (seed {results['seed']})")
    lines.append("=" * 78)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=int, default=None)
    parser.add_argument("--strict", action="store_true", help="exit 1 when the run did not show learning")
    args = parser.parse_args(argv)
    if not (args.out / "comparison.json").is_file():
        print(f"error: {args.out}/comparison.json is missing: run step 3 (python -m lit_rlhf.apps.compare_policies)",
              file=sys.stderr)
        return 1
    results = collect(args.out, args.seconds)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print()
    print("\n".join(report(results, args.out)))
    failed = [name for name in ("reward", "gold") if results[name]["ci_low"] <= 0]
    if failed:
        print(f"warning: the run did not show learning: the 95% interval of {' and '.join(failed)} does not lie "
              "above zero", file=sys.stderr)
        return 1 if args.strict else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
