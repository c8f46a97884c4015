"""DRO-V step time: `lit_rlhf.modules.DROVModule` (TRL has no DRO trainer: ours and its overhead only).

    python -m benchmarks.bench_drov --model tiny-random-llama --json benchmarks/results/drov_tiny.json

One step = one optimizer step on `batch_size` single-trajectory rows (`prompt_length` +
`completion_length` tokens, a normalised scalar reward each): policy forward+backward on the
rows, value network (a separate backbone + scalar head) forward+backward on the prompt columns,
reference forward, one AdamW over both (two learning rates).
"""

from __future__ import annotations

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
)
from lit_rlhf.training.memory import Memory

TAU = 1.0
LR = 1e-5


def ours(cfg: BenchConfig) -> WorkerResult:
    from lit_rlhf.modules import DROVModule

    torch.manual_seed(cfg.seed)  # the value head
    module = DROVModule(model=cfg.model, tau=TAU, lr=LR, value_lr=LR, lr_scheduler="cosine",
                        memory=Memory(release_host_memory=cfg.release_host_memory))
    rows = token_rows(module.tokenizer, cfg.batch_size * cfg.total_steps, cfg.prompt_length, cfg.completion_length)
    generator = torch.Generator().manual_seed(cfg.seed)
    batches = []
    for i in range(cfg.total_steps):
        rewards = torch.randn(cfg.batch_size, generator=generator)
        rewards = ((rewards - rewards.mean()) / rewards.std().clamp(min=1e-6)).tolist()  # mean 0, variance 1
        labels = [r > 0 for r in rewards]
        batches.append(single_batch(rows[i * cfg.batch_size: (i + 1) * cfg.batch_size], labels, rewards))
    parts = PartTimer()
    prompt_len = cfg.prompt_length

    def bare(batch, optimizer) -> None:
        """Policy fwd+bwd, value fwd+bwd on the prompts (last prompt token), ref fwd, DRO-V loss, AdamW."""
        policy, ref, value = module.policy, module.ref_model, module.value
        ids, mask, scored = batch.input_ids, batch.attention_mask.long(), batch.loss_mask
        with parts("reference_forward"), torch.no_grad():
            ref_logps = completion_logps_sum(ref(input_ids=ids, attention_mask=mask).logits, ids, scored)  # (B,)
        with parts("policy_value_forward_backward"):
            logps = completion_logps_sum(policy(input_ids=ids, attention_mask=mask).logits, ids, scored)  # (B,)
            hidden = value.backbone(input_ids=ids[:, :prompt_len], attention_mask=mask[:, :prompt_len]).last_hidden_state
            values = value.head(hidden[:, -1]).squeeze(-1)  # (B,)
            residual = batch.rewards - values - TAU * (logps - ref_logps)
            (0.5 * residual.pow(2).mean()).backward()
        with parts("optimizer_step"):
            optimizer.step()
        parts.end_step()

    step_times, bare_times = fit_ours(module, batches, cfg, bare)
    peak = peak_rss_mb()
    batch = batches[0]
    return WorkerResult(
        framework="ours", step_times=step_times, peak_rss_mb=peak, tokens_per_step=float(batch.attention_mask.sum()),
        bare_times=bare_times, bare_parts=parts.medians(cfg.warmup),
        info={"rows_per_step": int(batch.input_ids.shape[0]), "sequence_length": int(batch.input_ids.shape[1]),
              "trl": "no DRO trainer in TRL"},
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    return run_benchmark("drov", "benchmarks.bench_drov", argv, ours, None)


if __name__ == "__main__":
    main()
