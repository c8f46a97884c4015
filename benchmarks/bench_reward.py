"""Reward-model step time: `lit_rlhf.modules.RewardModule` vs TRL's `RewardTrainer`.

    python -m benchmarks.bench_reward --model tiny-random-llama --json benchmarks/results/reward_tiny.json

One step = one optimizer step on `batch_size` pairs (2B rows of `prompt_length` +
`completion_length` tokens): scorer forward+backward (backbone + scalar head read at the last
token, Bradley-Terry loss), AdamW. TRL gets the same weights as an
`AutoModelForSequenceClassification` (`lit_rlhf.models.to_sequence_classifier`).
"""

from __future__ import annotations

import tempfile
from typing import Any, Sequence

import torch

from benchmarks.common import (
    BenchConfig,
    PartTimer,
    WorkerResult,
    fit_ours,
    peak_rss_mb,
    preference_batch,
    run_benchmark,
    step_rows,
    trl_step_timer,
    trl_training_args,
)
from lit_rlhf.training.memory import Memory

LR = 1e-5


def ours(cfg: BenchConfig) -> WorkerResult:
    from lit_rlhf.modules import RewardModule

    torch.manual_seed(cfg.seed)  # the D11 head
    module = RewardModule(model=cfg.model, lr=LR, lr_scheduler="cosine",
                          memory=Memory(release_host_memory=cfg.release_host_memory))
    batches = [preference_batch(rows) for rows in step_rows(cfg, module.tokenizer)]
    parts = PartTimer()

    def bare(batch, optimizer) -> None:
        """Backbone forward, head at the last token, Bradley-Terry loss, backward, AdamW step."""
        scorer = module.reward_model
        half = batch.input_ids.shape[0] // 2
        with parts("scorer_forward_backward"):
            hidden = scorer.backbone(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).last_hidden_state
            rewards = scorer.head(hidden[:, -1]).squeeze(-1)  # (2B,) rows are unpadded: the last token is EOS
            (-torch.nn.functional.logsigmoid(rewards[:half] - rewards[half:]).mean()).backward()
        with parts("optimizer_step"):
            optimizer.step()
        parts.end_step()

    step_times, bare_times = fit_ours(module, batches, cfg, bare)
    peak = peak_rss_mb()
    batch = batches[0]
    return WorkerResult(
        framework="ours", step_times=step_times, peak_rss_mb=peak, tokens_per_step=float(batch.attention_mask.sum()),
        bare_times=bare_times, bare_parts=parts.medians(cfg.warmup),
        info={"rows_per_step": int(batch.input_ids.shape[0]), "sequence_length": int(batch.input_ids.shape[1])},
    )


def trl(cfg: BenchConfig) -> WorkerResult:
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    from lit_rlhf import models

    tokenizer = models.load_tokenizer(cfg.model)
    torch.manual_seed(cfg.seed)
    scalar = models.load_scalar_model(cfg.model, tokenizer, "float32")
    classifier, _ = models.to_sequence_classifier(scalar, tokenizer.pad_token_id)
    del scalar
    flat = [row for rows in step_rows(cfg, tokenizer) for row in rows]
    dataset = Dataset.from_list([
        {"chosen_ids": r["prompt_ids"] + r["chosen_ids"], "rejected_ids": r["prompt_ids"] + r["rejected_ids"]} for r in flat
    ])  # TRL's own pre-tokenised format: used as is
    timer = trl_step_timer()
    with tempfile.TemporaryDirectory() as out:
        args = RewardConfig(**trl_training_args(cfg, out, learning_rate=LR), max_length=None)
        trainer = RewardTrainer(model=classifier, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=[timer])
        trainer.train()
    tokens = 2 * cfg.batch_size * (cfg.prompt_length + cfg.completion_length)
    return WorkerResult(framework="trl", step_times=timer.times[cfg.warmup:], peak_rss_mb=peak_rss_mb(), tokens_per_step=float(tokens))


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    return run_benchmark("reward", "benchmarks.bench_reward", argv, ours, trl)


if __name__ == "__main__":
    main()
