"""GRPO step time: `lit_rlhf.modules.GRPOModule` vs TRL's `GRPOTrainer` (transformers generate).

    python -m benchmarks.bench_grpo --model tiny-random-llama --json benchmarks/results/grpo_tiny.json

One step = one rollout and one optimizer step: `batch_size` prompts x `--generations` samples of
exactly `completion_length` new tokens at most (temperature 1, KV cache), the old/reference
log-probs and the reward function on them, then policy forward+backward on the B*G rows, the
k3 KL to the reference (beta 0.04), gradient clipping at 1, AdamW. Both frameworks use the same
reward function (`benchmarks.common.alpha_fraction_reward`) and the same prompt texts.
The bare model work is sampling the same number of tokens with a KV cache (the plain loop of
model calls, `lit_rlhf.generation.sample_tokens`; transformers' `generate` adds per-token work
on top) + reference forward + policy forward+backward + clipping + AdamW.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
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
    trl_step_timer,
    trl_training_args,
)
from lit_rlhf.training.memory import Memory

BETA = 0.04
LR = 1e-6
TEMPERATURE = 1.0


def _extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--generations", type=int, default=4, help="G, completions per prompt")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping norm, both sides (0: off)")
    parser.add_argument("--optimizer-in-backward", action="store_true",
                        help="ours: the module's optimizer_in_backward (needs --max-grad-norm 0)")


def _texts(cfg: BenchConfig, tokenizer) -> list[list[str]]:
    rows = token_rows(tokenizer, cfg.batch_size * cfg.total_steps, cfg.prompt_length, cfg.completion_length)
    texts = prompt_texts(tokenizer, rows)
    return [texts[i * cfg.batch_size: (i + 1) * cfg.batch_size] for i in range(cfg.total_steps)]


def response_token_logps(model, ids: torch.Tensor, response_length: int) -> torch.Tensor:
    """Bare-baseline per-token log-probs (N, R) of the last R tokens (logits of R positions only)."""
    logits = model(input_ids=ids, logits_to_keep=response_length + 1).logits[:, :-1] / TEMPERATURE
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, -response_length:, None]).squeeze(-1)


def ours(cfg: BenchConfig) -> WorkerResult:
    from lit_rlhf.generation import SamplingConfig, sample_tokens
    from lit_rlhf.modules import GRPOModule
    from lit_rlhf.online import sources as online_rollout

    group = cfg.extra["generations"]
    module = GRPOModule(
        model=cfg.model, reward_fns=[alpha_fraction_reward], num_generations=group, max_new_tokens=cfg.completion_length,
        temperature=TEMPERATURE, kl_coef=BETA, lr=LR, max_grad_norm=cfg.extra["max_grad_norm"], log_completions_every_n_steps=0,
        memory=Memory(gradient_checkpointing=cfg.gradient_checkpointing, optimizer_in_backward=cfg.extra["optimizer_in_backward"], release_host_memory=cfg.release_host_memory),
    )
    tok = module.tokenizer
    batches = [prompt_batch(tok, texts) for texts in _texts(cfg, tok)]
    rollout_timer = CallTimer(module, "make_rollout")
    update_timer = CallTimer(module, "update")
    # mean response length (EOS included) of each rollout: both sides stop a row at its EOS
    generate_timer = CallTimer(online_rollout, "generate_responses", measure=lambda out, *a, **k: out[1].sum(dim=1).float().mean())
    parts = PartTimer()
    sampling = SamplingConfig(max_new_tokens=cfg.completion_length, temperature=TEMPERATURE)

    def bare(batch, optimizer) -> None:
        """generate, reference forward, policy forward+backward (clipped GRPO + k3 KL), clip, AdamW."""
        policy, ref = module.policy, module.ref_model
        prompt_ids = batch.input_ids.repeat_interleave(group, dim=0)  # (B*G, P), unpadded prompts
        with parts("generate"), torch.no_grad():
            policy.eval()
            sampled = sample_tokens(policy, prompt_ids, torch.ones_like(prompt_ids), sampling, tok.eos_token_id, tok.pad_token_id)
            ids = torch.cat([prompt_ids, sampled], dim=1)  # (B*G, P+R')
            policy.train()
        response_length = ids.shape[1] - prompt_ids.shape[1]
        with parts("reference_forward"), torch.no_grad():
            ref_logps = response_token_logps(ref, ids, response_length)  # (B*G, R')
        with parts("policy_forward_backward"):
            logps = response_token_logps(policy, ids, response_length)  # (B*G, R')
            advantages = torch.randn(ids.shape[0], 1)
            ratio = torch.exp(logps - logps.detach())
            k3 = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
            (-(ratio * advantages).mean() + BETA * k3.mean()).backward()
        with parts("optimizer_step"):
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            optimizer.step()
        parts.end_step()

    try:
        step_times, bare_times = fit_ours(module, batches, cfg, bare)
    finally:
        generate_timer.restore()
    peak = peak_rss_mb()
    n = cfg.batch_size * group
    gen = generate_timer.times
    prompt_tokens = int(batches[0].attention_mask.sum()) * group
    return WorkerResult(
        framework="ours", step_times=step_times, peak_rss_mb=peak,
        tokens_per_step=float(prompt_tokens + n * cfg.completion_length), completions_per_step=float(n),
        generation_times=gen[cfg.warmup:], rollout_times=rollout_timer.times[cfg.warmup:],
        update_times=update_timer.times[cfg.warmup:], bare_times=bare_times, bare_parts=parts.medians(cfg.warmup),
        info={"prompt_tokens_per_row": int(batches[0].attention_mask.sum(dim=1).max()), "generations": group,
              "mean_completion_length": statistics.mean(generate_timer.values[cfg.warmup:]),
              "note": "tokens_per_step counts max_new_tokens per completion (generation may stop early at EOS)"},
    )


def trl(cfg: BenchConfig) -> WorkerResult:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from lit_rlhf import models

    group = cfg.extra["generations"]
    tokenizer = models.load_tokenizer(cfg.model)
    texts = [t for step in _texts(cfg, tokenizer) for t in step]
    dataset = Dataset.from_list([{"prompt": t} for t in texts])
    timer = trl_step_timer()
    with tempfile.TemporaryDirectory() as out:
        # TRL builds its reference model from a path: hand it the same weights saved to disk (a
        # model directory with its tokenizer, e.g. the GPU benchmark's, is used as it is)
        weights = cfg.model
        if not (Path(cfg.model) / "config.json").is_file():
            weights = f"{out}/model"
            models.load_causal_lm(cfg.model, tokenizer, "float32").save_pretrained(weights)
            tokenizer.save_pretrained(weights)
        args = GRPOConfig(
            **trl_training_args(cfg, out, learning_rate=LR, per_device_train_batch_size=cfg.batch_size * group,
                                 max_grad_norm=cfg.extra["max_grad_norm"]),
            num_generations=group, max_completion_length=cfg.completion_length, temperature=TEMPERATURE, beta=BETA,
            num_iterations=1, epsilon=0.2, scale_rewards="group", loss_type="dapo", log_completions=False,
            shuffle_dataset=False, model_init_kwargs={"dtype": torch.float32},
        )
        trainer = GRPOTrainer(model=weights, reward_funcs=[alpha_fraction_reward], args=args, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[timer])
        rollout_timer = CallTimer(trainer, "_generate_and_score_completions")
        pad = tokenizer.pad_token_id

        def completion_length(out, *args, **kwargs):  # tokens after the prompt up to EOS (PAD after it)
            prompt = kwargs.get("input_ids", args[0] if args else None)
            return (out[:, prompt.shape[1]:] != pad).sum(dim=1).float().mean()

        generate_timer = CallTimer(trainer.model, "generate", measure=completion_length)
        trainer.train()
    n = cfg.batch_size * group
    prompt_tokens = sum(len(tokenizer(t)["input_ids"]) for t in texts[: cfg.batch_size]) * group
    steps = timer.times[cfg.warmup:]
    rollouts = rollout_timer.times[cfg.warmup:]
    return WorkerResult(
        framework="trl", step_times=steps, peak_rss_mb=peak_rss_mb(),
        tokens_per_step=float(prompt_tokens + n * cfg.completion_length), completions_per_step=float(n),
        generation_times=generate_timer.times[cfg.warmup:], rollout_times=rollouts,
        update_times=[s - r for s, r in zip(steps, rollouts)],
        info={"mean_completion_length": statistics.mean(generate_timer.values[cfg.warmup:])},
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    return run_benchmark("grpo", "benchmarks.bench_grpo", argv, ours, trl, extra=_extra)


if __name__ == "__main__":
    main()
