"""DPO step time: `lit_rlhf.modules.DPOModule` (live reference) vs TRL's `DPOTrainer`.

    python -m benchmarks.bench_dpo --model tiny-random-llama --json benchmarks/results/dpo_tiny.json

One step = one optimizer step on `batch_size` pairs of `prompt_length` + `completion_length`
tokens: policy forward+backward on the 2B chosen+rejected rows, reference forward, AdamW.
The bare model work is exactly that, written with plain torch on the same batch.
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
    preference_batch,
    run_benchmark,
    step_rows,
    trl_step_timer,
    trl_training_args,
)
from lit_rlhf.training.memory import Memory

BETA = 0.1
LR = 1e-5


def ours(cfg: BenchConfig) -> WorkerResult:
    from lit_rlhf.modules import DPOModule

    module = DPOModule(model=cfg.model, beta=BETA, lr=LR, lr_scheduler="cosine", memory=Memory(gradient_checkpointing=cfg.gradient_checkpointing, optimizer_in_backward=bool(cfg.extra.get("optimizer_in_backward")), release_host_memory=cfg.release_host_memory))
    batches = [preference_batch(rows) for rows in step_rows(cfg, module.tokenizer)]
    parts = PartTimer()

    def bare(batch, optimizer) -> None:
        """Policy fwd+bwd on the 2B rows, reference fwd, the DPO sigmoid loss, AdamW step."""
        policy, ref = module.policy, module.ref_model
        half = batch.input_ids.shape[0] // 2
        with parts("policy_forward_backward"):
            logits = policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits
            logps = completion_logps_sum(logits, batch.input_ids, batch.loss_mask)  # (2B,)
        with parts("reference_forward"), torch.no_grad():
            ref_logits = ref(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits
            ref_logps = completion_logps_sum(ref_logits, batch.input_ids, batch.loss_mask)  # (2B,)
        with parts("policy_forward_backward"):
            h = (logps[:half] - ref_logps[:half]) - (logps[half:] - ref_logps[half:])  # (B,)
            (-torch.nn.functional.logsigmoid(BETA * h).mean()).backward()
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
    from trl import DPOConfig, DPOTrainer

    from lit_rlhf import models

    tokenizer = models.load_tokenizer(cfg.model)
    policy = models.load_causal_lm(cfg.model, tokenizer, "float32")
    steps = step_rows(cfg, tokenizer)
    flat = [row for rows in steps for row in rows]
    dataset = Dataset.from_list(flat)  # prompt_ids / chosen_ids / rejected_ids: already tokenised

    class PreTokenizedDPOTrainer(DPOTrainer):
        """Feed the exact token ids ours gets (TRL would re-tokenise text, merging across the boundary)."""

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            return dataset

    timer = trl_step_timer()
    with tempfile.TemporaryDirectory() as out:
        args = DPOConfig(**trl_training_args(cfg, out, learning_rate=LR), beta=BETA, loss_type=["sigmoid"],
                         max_length=None, precompute_ref_log_probs=False)
        trainer = PreTokenizedDPOTrainer(model=policy, ref_model=models.frozen_copy(policy), args=args, train_dataset=dataset, processing_class=tokenizer,
                                         callbacks=[timer])
        trainer.train()
    tokens = 2 * cfg.batch_size * (cfg.prompt_length + cfg.completion_length)
    return WorkerResult(framework="trl", step_times=timer.times[cfg.warmup:], peak_rss_mb=peak_rss_mb(), tokens_per_step=float(tokens),
                        info={"trl_ref_model": type(trainer.ref_model).__name__ if trainer.ref_model is not None else None})


def _extra(parser) -> None:
    parser.add_argument("--optimizer-in-backward", action="store_true",
                        help="ours: the module's optimizer_in_backward (AdamW stepped per parameter in the backward pass)")


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    return run_benchmark("dpo", "benchmarks.bench_dpo", argv, ours, trl, extra=_extra)


if __name__ == "__main__":
    main()
