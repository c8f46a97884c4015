"""What DAPO's dynamic sampling costs: responses generated per response trained on, and time.

    python -m benchmarks.bench_dynamic_sampling --model smollm2-135m-instruct --steps 4

`DAPOModule` with GRPO's clip and no overlong filtering on the bundled arithmetic word problems
(`bundled:arithmetic`, reward: `MathAnswerReward`), the same seed and settings with
`dynamic_sampling` off and on (`max_sampling_rounds` bounds the extra rounds). Per optimizer step it records `dynamic_sampling/rollouts_per_step` (responses
generated / responses trained on; 1 without dynamic sampling), the informative groups found,
the generation and update seconds and the whole step's wall time, and writes them to
`benchmarks/results/dynamic_sampling_<model>.json`. The extra generation depends on how often a
group's G answers are all right or all wrong, i.e. on the model and the task: the tiny random
model never answers right, so every group is uninformative and every step runs all rounds (the
worst case); SmolLM2-135M answers some questions right.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import lightning as L
import torch

from lit_rlhf.data import QADataModule
from lit_rlhf.modules import DAPOModule
from lit_rlhf.rewards import MathAnswerReward


class StepRecorder(L.Callback):
    def __init__(self):
        self.steps: list[dict[str, float]] = []
        self._t = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._t = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        m = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")}
        m["step_s"] = time.perf_counter() - self._t
        self.steps.append(m)


def measure(model: str, dynamic: bool, steps: int, batch_size: int, generations: int, max_new_tokens: int,
            rounds: int) -> list[dict[str, float]]:
    L.seed_everything(0)
    # DAPO's dynamic sampling alone: GRPO's clip, every completion in the loss
    module = DAPOModule(model=model, reward_fns=[MathAnswerReward()], num_generations=generations,
                        max_new_tokens=max_new_tokens, temperature=1.0, kl_coef=0.0, lr=1e-5, lr_scheduler="constant",
                        dynamic_sampling=dynamic, max_sampling_rounds=rounds, log_completions_every_n_steps=0,
                        clip_eps_high=0.2, mask_truncated=False)
    dm = QADataModule(tokenizer=module.tokenizer, chat=False, prompt_template="Question: {question}\nAnswer:",
                      batch_size=batch_size, max_prompt_length=256, val_split=None, test_split=None)
    recorder = StepRecorder()
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                        callbacks=[recorder])
    trainer.fit(module, datamodule=dm)
    return recorder.steps


def summary(steps: list[dict[str, float]]) -> dict[str, float]:
    def med(key):
        values = [s[key] for s in steps if key in s]
        return statistics.median(values) if values else float("nan")

    return {"steps": len(steps), "rollouts_per_step_mean": statistics.mean(
        s.get("train/dynamic_sampling/rollouts_per_step", 1.0) for s in steps),
        "step_s_median": med("step_s"), "generation_s_median": med("train/time/generation"),
        "update_s_median": med("train/time/update"), "reward_mean": statistics.mean(
            s["train/objective/scores"] for s in steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-random-llama")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--max-sampling-rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    result = {"model": args.model, "settings": vars(args), "load_before": load_before}
    for dynamic in (False, True):
        steps = measure(args.model, dynamic, args.steps, args.batch_size, args.generations, args.max_new_tokens,
                        args.max_sampling_rounds)
        result["dynamic" if dynamic else "plain"] = {"summary": summary(steps), "per_step": steps}
    result["load_after"] = os.getloadavg()[0]
    out = Path(args.out) / f"dynamic_sampling_{args.model}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"| {'dynamic sampling':<16} | steps | rollouts / opt. step | step s (median) | generation s | update s | "
          "mean reward |")
    print("|---|---|---|---|---|---|---|")
    for key in ("plain", "dynamic"):
        s = result[key]["summary"]
        print(f"| {key:<16} | {s['steps']} | {s['rollouts_per_step_mean']:.2f} | {s['step_s_median']:.2f} | "
              f"{s['generation_s_median']:.2f} | {s['update_s_median']:.2f} | {s['reward_mean']:.3f} |")
    print(f"load average before/after: {load_before:.1f}/{result['load_after']:.1f}; written to {out}")


if __name__ == "__main__":
    main()
