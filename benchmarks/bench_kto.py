"""KTO step time: `lit_rlhf.modules.KTOModule` vs TRL's `KTOTrainer`.

    python -m benchmarks.bench_kto --model tiny-random-llama --json benchmarks/results/kto_tiny.json

One step = one optimizer step on `batch_size` unpaired rows (`prompt_length` +
`completion_length` tokens, desirable and undesirable alternating): policy forward+backward on
the rows, the KL reference point z0 from the B mismatched pairs (prompt i, completion i+1;
policy and reference forward without grad), reference forward on the rows, AdamW. TRL pairs the
same rows the same way (`KL_completion_ids` = completions rotated by one within the batch).
"""

from __future__ import annotations

import tempfile
from typing import Any, Sequence

import torch

from benchmarks.common import (
    BenchConfig,
    PartTimer,
    WorkerResult,
    completion_logps_sum,
    fit_ours,
    peak_rss_mb,
    run_benchmark,
    single_batch,
    token_rows,
    trl_step_timer,
    trl_training_args,
)
from lit_rlhf.training.memory import Memory

BETA = 0.1
LR = 1e-5


def _steps(cfg: BenchConfig, tokenizer) -> list[tuple[list[dict[str, list[int]]], list[bool]]]:
    rows = token_rows(tokenizer, cfg.batch_size * cfg.total_steps, cfg.prompt_length, cfg.completion_length)
    labels = [i % 2 == 0 for i in range(cfg.batch_size)]
    return [(rows[i * cfg.batch_size: (i + 1) * cfg.batch_size], labels) for i in range(cfg.total_steps)]


def _completions(rows: list[dict[str, list[int]]], labels: list[bool]) -> list[list[int]]:
    return [r["chosen_ids"] if good else r["rejected_ids"] for r, good in zip(rows, labels)]


def ours(cfg: BenchConfig) -> WorkerResult:
    from lit_rlhf.modules import KTOModule

    module = KTOModule(model=cfg.model, beta=BETA, lr=LR, lr_scheduler="cosine",
                       memory=Memory(release_host_memory=cfg.release_host_memory))
    batches = [single_batch(rows, labels) for rows, labels in _steps(cfg, module.tokenizer)]
    parts = PartTimer()
    prompt_len = cfg.prompt_length

    def bare(batch, optimizer) -> None:
        """Mismatched pairs (policy + ref fwd, no grad), policy fwd+bwd, ref fwd, KTO loss, AdamW."""
        policy, ref = module.policy, module.ref_model
        ids, mask, scored = batch.input_ids, batch.attention_mask.long(), batch.loss_mask
        kl_ids = torch.cat([ids[:, :prompt_len], ids[:, prompt_len:].roll(1, dims=0)], dim=1)  # equal lengths: no padding
        with parts("kl_forwards"), torch.no_grad():
            kl = (completion_logps_sum(policy(input_ids=kl_ids, attention_mask=mask).logits, kl_ids, scored)
                  - completion_logps_sum(ref(input_ids=kl_ids, attention_mask=mask).logits, kl_ids, scored)).mean().clamp(min=0)
        with parts("reference_forward"), torch.no_grad():
            ref_logps = completion_logps_sum(ref(input_ids=ids, attention_mask=mask).logits, ids, scored)  # (B,)
        with parts("policy_forward_backward"):
            logps = completion_logps_sum(policy(input_ids=ids, attention_mask=mask).logits, ids, scored)  # (B,)
            r = logps - ref_logps
            sign = batch.labels.float() * 2 - 1  # +1 desirable, -1 undesirable
            (1 - torch.sigmoid(BETA * sign * (r - kl))).mean().backward()
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
    from trl import KTOConfig, KTOTrainer

    from lit_rlhf import models

    tokenizer = models.load_tokenizer(cfg.model)
    policy = models.load_causal_lm(cfg.model, tokenizer, "float32")
    records = []
    for rows, labels in _steps(cfg, tokenizer):
        completions = _completions(rows, labels)
        rotated = completions[-1:] + completions[:-1]  # TRL's own KL pairing: completions rotated by one per batch
        for r, good, completion, kl_completion in zip(rows, labels, completions, rotated):
            records.append({"prompt_ids": r["prompt_ids"], "completion_ids": completion, "KL_completion_ids": kl_completion,
                            "label": good})
    dataset = Dataset.from_list(records)

    class PreTokenizedKTOTrainer(KTOTrainer):
        """Feed the exact token ids ours gets (TRL would re-tokenise text)."""

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            return dataset

    timer = trl_step_timer()
    with tempfile.TemporaryDirectory() as out:
        args = KTOConfig(**trl_training_args(cfg, out, learning_rate=LR), beta=BETA, max_length=None,
                         precompute_ref_log_probs=False)
        trainer = PreTokenizedKTOTrainer(model=policy, ref_model=models.frozen_copy(policy), args=args, train_dataset=dataset,
                                         processing_class=tokenizer, callbacks=[timer])
        trainer.train()
    tokens = cfg.batch_size * (cfg.prompt_length + cfg.completion_length)
    return WorkerResult(framework="trl", step_times=timer.times[cfg.warmup:], peak_rss_mb=peak_rss_mb(), tokens_per_step=float(tokens))


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    return run_benchmark("kto", "benchmarks.bench_kto", argv, ours, trl)


if __name__ == "__main__":
    main()
