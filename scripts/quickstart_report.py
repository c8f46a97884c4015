"""Print where the quickstart wrote its logs, checkpoints and models, and what it measured.

    python scripts/quickstart_report.py outputs/quickstart [--seconds N]

Reads the TensorBoard event files the three steps wrote (the same numbers TensorBoard shows).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    if not run_dir.is_dir():
        return {}
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def last(values: dict[str, list[tuple[int, float]]], tag: str) -> float | None:
    series = values.get(tag)
    return series[-1][1] if series else None


def fmt(value: float | None, pattern: str = "{:.3f}") -> str:
    return "n/a" if value is None else pattern.format(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=int, default=None)
    args = parser.parse_args(argv)
    out: Path = args.out
    reward, start, grpo = scalars(out / "reward"), scalars(out / "grpo_start"), scalars(out / "grpo")

    acc = last(reward, "val/rewards/accuracy")
    before, after = last(start, "val/objective/scores"), last(grpo, "val/objective/scores")
    kl = last(grpo, "val/objective/kl")
    win, low, high = (last(grpo, f"val/judge/{k}") for k in ("win_rate", "win_rate_ci_low", "win_rate_ci_high"))
    n = last(grpo, "val/judge/num_valid")

    print()
    print("=" * 72)
    print("lit_rlhf quickstart: SmolLM2-135M-Instruct, bundled TL;DR-style data, CPU")
    print("=" * 72)
    print(f"TensorBoard logs      tensorboard --logdir {out}")
    print(f"checkpoints           {out}/reward/checkpoints, {out}/grpo/checkpoints")
    print(f"reward model (HF)     {out}/reward_model   (AutoModelForSequenceClassification)")
    print(f"policy (HF)           {out}/policy         (AutoModelForCausalLM)")
    print("-" * 72)
    print(f"reward model          validation accuracy {fmt(acc)}")
    print(f"policy reward         before {fmt(before)} -> after {fmt(after)} (mean on the validation prompts)")
    print(f"KL to the start       {fmt(kl)} nats per response (validation)")
    ci = f"[{fmt(low)}, {fmt(high)}]"
    print(f"judged win rate       {fmt(win)} vs the starting policy, 95% CI {ci}, n={fmt(n, '{:.0f}')}")
    if args.seconds is not None:
        print(f"wall time             {args.seconds // 60} min {args.seconds % 60} s")
    print("=" * 72)
    missing = [name for name, value in [("reward accuracy", acc), ("reward before", before), ("reward after", after),
                                        ("KL", kl), ("win rate", win)] if value is None]
    if missing:
        print(f"missing from the logs: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
