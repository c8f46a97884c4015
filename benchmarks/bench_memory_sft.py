"""SFT step memory and time: `lit_rlhf.modules.SFTModule` vs TRL's `SFTTrainer` (completion-only loss).

    python -m benchmarks.bench_memory_sft --model tiny-random-llama --no-bare

One step = one optimizer step on `batch_size` rows of `prompt_length` prompt + `completion_length`
completion tokens (the loss on the completion tokens only): forward+backward, AdamW. Both sides
get the same token ids (the chosen completions of `benchmarks.common.token_rows`), unpadded.
Used by `benchmarks.bench_memory` for the SFT rows; the bare model work is a plain forward with
dense logits, a masked token-mean NLL, backward and AdamW.
"""

from __future__ import annotations

import tempfile
from typing import Any, Sequence

import torch

from benchmarks.common import (
    BenchConfig,
    WorkerResult,
    fit_ours,
    peak_rss_mb,
    run_benchmark,
    step_rows,
    trl_step_timer,
    trl_training_args,
)
from lit_rlhf.training.memory import Memory

LR = 1e-5


def sft_batch(rows: Sequence[dict[str, list[int]]]):
    """An `SFTBatch` of equal-length rows (prompt + chosen completion), loss on the completion."""
    from lit_rlhf.types import SFTBatch

    ids = torch.tensor([r["prompt_ids"] + r["chosen_ids"] for r in rows], dtype=torch.long)  # (B, P+C)
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    loss_mask[:, len(rows[0]["prompt_ids"]):] = True
    return SFTBatch(ids, torch.ones_like(ids, dtype=torch.bool), loss_mask, meta={"index": list(range(len(rows)))})


def ours(cfg: BenchConfig) -> WorkerResult:
    from lit_rlhf.modules import SFTModule

    module = SFTModule(model=cfg.model, lr=LR, lr_scheduler="cosine", memory=Memory(gradient_checkpointing=cfg.gradient_checkpointing, optimizer_in_backward=bool(cfg.extra.get("optimizer_in_backward")), release_host_memory=cfg.release_host_memory,
                                     **({"logprob_chunk_size": cfg.extra["logprob_chunk_size"]} if cfg.extra.get("logprob_chunk_size") else {})))
    batches = [sft_batch(rows) for rows in step_rows(cfg, module.tokenizer)]

    def bare(batch, optimizer) -> None:
        logits = module.policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.input_ids[:, 1:].flatten(), reduction="none")
        mask = batch.loss_mask[:, 1:].flatten().float()
        ((nll * mask).sum() / mask.sum()).backward()
        optimizer.step()

    step_times, bare_times = fit_ours(module, batches, cfg, bare)
    batch = batches[0]
    return WorkerResult(framework="ours", step_times=step_times, peak_rss_mb=peak_rss_mb(),
                        tokens_per_step=float(batch.attention_mask.sum()), bare_times=bare_times,
                        info={"sequence_length": int(batch.input_ids.shape[1])})


def trl(cfg: BenchConfig) -> WorkerResult:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from lit_rlhf import models

    tokenizer = models.load_tokenizer(cfg.model)
    policy = models.load_causal_lm(cfg.model, tokenizer, "float32")
    flat = [row for rows in step_rows(cfg, tokenizer) for row in rows]
    # already tokenised (TRL skips its own tokenisation when `input_ids` is there); loss on the completion
    dataset = Dataset.from_list([
        {"input_ids": r["prompt_ids"] + r["chosen_ids"], "completion_mask": [0] * len(r["prompt_ids"]) + [1] * len(r["chosen_ids"])}
        for r in flat
    ])
    timer = trl_step_timer()
    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(**trl_training_args(cfg, out, learning_rate=LR), max_length=None, completion_only_loss=True,
                         packing=False, padding_free=False)
        trainer = SFTTrainer(model=policy, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=[timer])
        trainer.train()
    tokens = cfg.batch_size * (cfg.prompt_length + cfg.completion_length)
    return WorkerResult(framework="trl", step_times=timer.times[cfg.warmup:], peak_rss_mb=peak_rss_mb(), tokens_per_step=float(tokens))


def _extra(parser) -> None:
    parser.add_argument("--optimizer-in-backward", action="store_true",
                        help="ours: the module's optimizer_in_backward (AdamW stepped per parameter in the backward pass)")
    parser.add_argument("--logprob-chunk-size", type=int, default=None,
                        help="ours: the module's logprob_chunk_size (scored tokens per output-layer chunk; default: the module's)")


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    return run_benchmark("sft", "benchmarks.bench_memory_sft", argv, ours, trl, extra=_extra)


if __name__ == "__main__":
    main()
