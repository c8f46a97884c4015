"""A run that visibly learns: GRPO on arithmetic word problems with a verifiable reward.

    python examples/verifiable_math.py --config examples/verifiable_math.yaml

Builds the model and data from the config (LightningCLI, as `main.py` does), measures greedy
accuracy on the held-out test split, trains, measures again, and prints

    split    n    before   after   rise   95% interval of the rise

where the interval is the normal approximation for the mean of the paired per-question
differences (after - before, each in {-1, 0, 1}): mean +/- 1.96 * sd / sqrt(n). It saves the
learning curve (mean training reward per step, from the CSV log) next to the log, and the
numbers to `results.json`. Any `main.py` override works after the config, e.g.
`--model.init_args.total_episodes 64`.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from pathlib import Path

import torch

from lit_rlhf.cli import main as cli_main
from lit_rlhf.generation import SamplingConfig, decode_responses, generate_responses
from lit_rlhf.rewards import answers_match


@torch.no_grad()
def greedy_accuracy(module, datamodule, role: str = "test", max_new_tokens: int | None = None) -> list[bool]:
    """Per-question correctness of greedy answers on a split of a `QADataModule`."""
    config = SamplingConfig(max_new_tokens=max_new_tokens or module.sampling.max_new_tokens, temperature=1.0,
                            do_sample=False)
    tokenizer = module.tokenizer
    correct: list[bool] = []
    for batch in datamodule._loader(role, shuffle=False):
        batch = batch.to(module.device)
        ids, mask, _ = generate_responses(module.policy, batch.input_ids, batch.attention_mask.bool(), config,
                                          tokenizer.eos_token_id, tokenizer.pad_token_id)
        texts = decode_responses(tokenizer, ids, mask)
        correct += [answers_match(ref, text) for ref, text in zip(batch.meta["reference"], texts)]
    return correct


def paired_rise(before: list[bool], after: list[bool]) -> tuple[float, float, float]:
    """(mean rise, low, high): 95% normal interval of the mean paired difference."""
    diffs = [float(a) - float(b) for b, a in zip(before, after)]
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else 0.0
    half = 1.96 * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def learning_curve(log_dir: Path, out: Path) -> list[float]:
    """Mean training reward per step from the CSV log, drawn to `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (path,) = list(log_dir.rglob("metrics.csv")) or [None]
    rows = list(csv.DictReader(path.open())) if path else []
    rewards = [float(r["train/objective/scores"]) for r in rows if r.get("train/objective/scores")]
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot(range(1, len(rewards) + 1), rewards, marker="o")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward (fraction right)")
    ax.set_title("training reward, sampled at temperature 1")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return rewards


def run(args: list[str]) -> dict:
    started = time.perf_counter()
    cli = cli_main(args, run=False)
    module, datamodule, trainer = cli.model, cli.datamodule, cli.trainer
    datamodule.setup("test")
    t0 = time.perf_counter()
    before = greedy_accuracy(module, datamodule)
    eval_s = time.perf_counter() - t0
    trainer.fit(module, datamodule=datamodule)
    train_s = time.perf_counter() - t0 - eval_s
    after = greedy_accuracy(module, datamodule)
    rise, low, high = paired_rise(before, after)
    log_dir = Path(trainer.log_dir or trainer.default_root_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    curve = learning_curve(log_dir, log_dir / "learning_curve.png")
    result = {
        "n": len(before), "before": sum(before) / len(before), "after": sum(after) / len(after),
        "rise": rise, "rise_95ci": [low, high], "steps": len(curve), "train_reward": curve,
        "episodes": module.episodes, "seconds_eval_each": eval_s, "seconds_train": train_s,
        "seconds_total": time.perf_counter() - started, "cpu_seconds": time.process_time(),
        "threads": torch.get_num_threads(),
    }
    print()
    print(f"{'split':<8}{'n':>5}{'before':>9}{'after':>8}{'rise':>8}   95% interval of the rise")
    print(f"{'test':<8}{result['n']:>5}{result['before']:>9.3f}{result['after']:>8.3f}{rise:>+8.3f}   "
          f"[{low:+.3f}, {high:+.3f}]")
    print(f"{result['steps']} GRPO steps, {result['episodes']} sampled answers; {train_s:.0f} s training, "
          f"{eval_s:.0f} s per evaluation, {result['seconds_total']:.0f} s in all "
          f"({result['cpu_seconds']:.0f} CPU s, {result['threads']} threads); curve: {log_dir / 'learning_curve.png'}")
    (log_dir / "results.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    run(sys.argv[1:])
