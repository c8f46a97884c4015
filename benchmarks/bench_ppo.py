"""PPO step time: `lit_rlhf.modules.PPOModule` (ours and its overhead; see RESULTS.md for TRL).

    python -m benchmarks.bench_ppo --model tiny-random-llama --json benchmarks/results/ppo_tiny.json

The installed TRL (1.x) has no PPOTrainer any more (it left `trl` and `trl.experimental`), so
there is no TRL side to run here; the script still reports ours and its overhead ratio.

One training step = one rollout + `--ppo-epochs` optimizer steps (N+ Table 7: 4 epochs, one
minibatch): `batch_size` prompts, exactly `completion_length` sampled tokens at most
(temperature 0.7), old/reference log-probs and values of the rollout, the reward function,
per-token KL rewards, GAE, then per epoch policy + value forward+backward, clipping, AdamW.
The bare model work is `generate` of the same number of tokens + reference forward + value
forward (the rollout's values) + per epoch policy and value forward+backward, clipping, AdamW.
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

import torch

from benchmarks.common import (
    BenchConfig,
    CallTimer,
    PartTimer,
    WorkerResult,
    alpha_fraction_reward,
    fit_ours,
    peak_rss_mb,
    prompt_batch,
    prompt_texts,
    run_benchmark,
    token_rows,
)

LR = 3e-6
TEMPERATURE = 0.7


def _extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ppo-epochs", type=int, default=4, help="optimizer steps per rollout (K)")


def response_token_logps(model, ids: torch.Tensor, response_length: int) -> torch.Tensor:
    """Bare-baseline per-token log-probs (N, R) of the last R tokens (logits of R positions only)."""
    logits = model(input_ids=ids, logits_to_keep=response_length + 1).logits[:, :-1] / TEMPERATURE
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, -response_length:, None]).squeeze(-1)


def ours(cfg: BenchConfig) -> WorkerResult:
    from lit_rlhf.modules import PPOModule

    epochs = cfg.extra["ppo_epochs"]
    torch.manual_seed(cfg.seed)  # the value head
    module = PPOModule(
        model=cfg.model, reward_fns=[alpha_fraction_reward], max_new_tokens=cfg.completion_length, temperature=TEMPERATURE,
        ppo_epochs=epochs, num_minibatches=1, lr=LR, max_grad_norm=1.0, log_completions_every_n_steps=0,
    )
    tok = module.tokenizer
    rows = token_rows(tok, cfg.batch_size * cfg.total_steps, cfg.prompt_length, cfg.completion_length)
    texts = prompt_texts(tok, rows)
    batches = [prompt_batch(tok, texts[i * cfg.batch_size: (i + 1) * cfg.batch_size]) for i in range(cfg.total_steps)]
    rollout_timer = CallTimer(module, "make_rollout")
    update_timer = CallTimer(module, "update")
    generate_timer = CallTimer(module.policy, "generate")
    parts = PartTimer()

    def bare(batch, optimizer) -> None:
        policy, ref, value = module.policy, module.ref_model, module.value_model
        with parts("generate"), torch.no_grad():
            policy.eval()
            ids = policy.generate(
                input_ids=batch.input_ids, attention_mask=torch.ones_like(batch.input_ids), max_new_tokens=cfg.completion_length,
                do_sample=True, temperature=TEMPERATURE, top_k=None, top_p=None, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id, use_cache=True,
            )  # (B, P+R')
            policy.train()
        response_length = ids.shape[1] - batch.input_ids.shape[1]
        with parts("reference_and_value_forward"), torch.no_grad():
            ref_logps = response_token_logps(ref, ids, response_length)  # (B, R')
            old_values = value(ids, torch.ones_like(ids))[:, -response_length - 1: -1]  # (B, R')
        returns = old_values + torch.randn_like(old_values)
        advantages = torch.randn_like(ref_logps)
        for _ in range(epochs):
            with parts("policy_value_forward_backward"):
                logps = response_token_logps(policy, ids, response_length)
                values = value(ids, torch.ones_like(ids))[:, -response_length - 1: -1]
                ratio = torch.exp(logps - ref_logps.detach())
                loss = -(ratio * advantages).mean() + 0.1 * 0.5 * (values - returns).pow(2).mean()
                loss.backward()
            with parts("optimizer_step"):
                torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        parts.end_step()

    step_times, bare_times = fit_ours(module, batches, cfg, bare, optimizer_steps_per_batch=epochs)
    peak = peak_rss_mb()
    prompt_tokens = int(batches[0].attention_mask.sum())
    return WorkerResult(
        framework="ours", step_times=step_times, peak_rss_mb=peak, optimizer_steps_per_step=epochs,
        tokens_per_step=float(prompt_tokens + cfg.batch_size * cfg.completion_length), completions_per_step=float(cfg.batch_size),
        generation_times=generate_timer.times[::2][cfg.warmup:], rollout_times=rollout_timer.times[cfg.warmup:],
        update_times=update_timer.times[cfg.warmup:], bare_times=bare_times, bare_parts=parts.medians(cfg.warmup),
        info={"ppo_epochs": epochs, "trl": "no PPOTrainer in the installed TRL"},
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    return run_benchmark("ppo", "benchmarks.bench_ppo", argv, ours, None, extra=_extra)


if __name__ == "__main__":
    main()
