"""DAPO's dynamic sampling under DDP; every rank records its sampling rounds (JSON).

    python tests/distributed/run_dynamic_sampling.py --out DIR   # per rank (launch.py)

The reward makes the ranks need different numbers of sampling rounds, the case where ranks that
decided alone would run different numbers of generations (and collectives) and hang:

- `never`: rank 0's groups are never informative (its reward is a constant 0), rank 1's always
  are (a reward that differs between any two different completions). Rank 0 alone would sample
  `max_sampling_rounds` rounds, rank 1 alone one.
- `alternate`: rank 0's reward is constant on its 1st, 3rd, ... call and informative on the
  others (it needs two rounds per step), rank 1's always informative (one round).

Per fit and rank: the prompts and scores of every sampling round (from the rollout hook), the
prompts and scores of the batch trained on (`on_rollout_end`), the logged dynamic-sampling
stats, the episode and refill counters and a fingerprint of the weights. `alternate` is also
checkpointed after its first step and resumed for the second, next to a straight two-step fit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from lit_rlhf.data.sampler import ResumableSampler  # noqa: E402

from tests.distributed import workloads as W  # noqa: E402

PROMPTS_PER_RANK = 2
GROUP = 2
MAX_ROUNDS = 3


class RankReward:
    """Rank 0: 0 for every completion (all of them, `never`) or on every other call
    (`alternate`); other ranks: a score that differs between different completions."""

    def __init__(self, mode: str) -> None:
        self.mode, self.calls = mode, 0

    def __call__(self, prompts: list[str], completions: list[str], **columns) -> list[float]:
        self.calls += 1
        rank, _ = W.world()
        flat = rank == 0 and (self.mode == "never" or self.calls % 2 == 1)
        if flat:
            return [0.0] * len(completions)
        return [sum(map(ord, c)) % 997 / 997 + len(c) / 1000 for c in completions]


class RoundProbe(L.Callback):
    """Per training step: the rounds sampled (prompts, scores) and the batch trained on."""

    def __init__(self) -> None:
        self.steps: list[dict] = []
        self._rounds: list[dict] = []

    def on_rollout_scores(self, trainer, pl_module, rollout):
        self._rounds.append({"prompts": list(rollout.meta["prompt"]), "scores": rollout.scores.tolist()})
        return rollout

    def on_rollout_end(self, trainer, pl_module, rollout):
        self.steps.append({
            "rounds": self._rounds, "trained_prompts": list(rollout.meta["prompt"]),
            "trained_scores": rollout.scores.tolist(), "rows": int(rollout.response_ids.shape[0]),
        })
        self._rounds = []


def build(mode: str):
    return W.build_module(
        "dapo", reward_fns=[RankReward(mode)], num_generations=GROUP, scale="group", kl_coef=0.0,
        dynamic_sampling=True, max_sampling_rounds=MAX_ROUNDS, micro_batch_size=None,
    )


def resumable_loader(tokenizer, trainer) -> DataLoader:
    """The workload's prompts in the library's resumable order (a resumed run skips the batches
    of the epoch already trained on); rank r reads rows r, r + W, ..."""
    rows, collate = W.rows_for("grpo", tokenizer)
    rank, size = W.world()
    sampler = ResumableSampler(rows, PROMPTS_PER_RANK, num_replicas=size, rank=rank, shuffle=False, trainer=trainer)
    return DataLoader(rows, batch_size=PROMPTS_PER_RANK, sampler=sampler, collate_fn=collate)


def fit(mode: str, root: Path, steps: int, ckpt_path: str | None = None, save: Path | None = None) -> dict:
    rank, _ = W.world()
    L.seed_everything(1 + rank)  # each rank samples differently, as in a real run
    module = build(mode)
    probe, record = RoundProbe(), W.RecordMetrics()
    trainer = W.trainer_for("ddp", root, max_steps=steps, callbacks=[probe, record])
    trainer.fit(module, resumable_loader(module.tokenizer, trainer), ckpt_path=ckpt_path)
    if save is not None:
        trainer.save_checkpoint(save)
    stats = [{k.split("/")[-1]: v for k, v in m.items() if "dynamic_sampling/" in k} for m in record.steps]
    return {
        "steps": probe.steps, "stats": stats, "episodes": module.episodes, "refill_batches": module.refill_batches,
        "global_step": trainer.global_step, "fingerprint": W.fingerprint(module),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs = args.out / "runs"
    ckpt = runs / "alternate_step1.ckpt"
    results = {
        "never": fit("never", runs / "never", steps=2),
        "alternate": fit("alternate", runs / "alternate", steps=2),
        "alternate_first": fit("alternate", runs / "alternate_first", steps=1, save=ckpt),
    }
    results["alternate_resumed"] = fit("alternate", runs / "alternate_resumed", steps=2, ckpt_path=str(ckpt))
    W.write_result(args.out, results)


if __name__ == "__main__":
    main()
