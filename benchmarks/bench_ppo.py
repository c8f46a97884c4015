"""PPO step time: `lit_rlhf.modules.PPOModule` vs TRL's `trl.experimental.ppo.PPOTrainer` (TRL 1.12).

    /tmp/benchvenv-ppo/bin/python -m benchmarks.bench_ppo --model tiny-random-llama --json benchmarks/results/ppo_tiny.json

TRL 1.12.0 is the last release with a PPOTrainer (`trl.experimental.ppo`; it is gone from TRL
1.13 on), so the TRL side needs its own virtual environment (see benchmarks/README.md). With a
TRL that lacks it (or no TRL), the script says so and runs ours only.

One training step = one rollout + `--ppo-epochs` optimizer steps (N+ Table 7: 4 epochs, one
minibatch): `batch_size` prompts, `completion_length` sampled tokens at most (temperature 0.7,
stopping at EOS), old/reference log-probs, the values and the reward-model scores of the
rollout, per-token k1 KL rewards (0.05), GAE (gamma 1, lambda 0.95), whitened advantages, then
per epoch policy + value forward+backward (clip 0.2, value clip 0.2, value coefficient 0.1) and
AdamW (eps 1e-5) over policy and value together.

Both sides score with the same reward MODEL (TRL's PPOTrainer takes no reward function): a
one-label `AutoModelForSequenceClassification` built deterministically from `--seed` out of the
policy's weights with a fresh scalar head (`reward_model_dir`); the value model starts from it
on both sides (D22). Both get the same prompt token ids in the same batches (TRL's shuffled
prompt loader is replaced by an unshuffled one).

Differences left: ours clips gradients at norm 1.0 (`max_grad_norm=1.0`), TRL's PPO loop never
clips; ours computes the old log-probs with one extra policy forward over the rollout, TRL reads
them from the scores `generate` returns (keeping B x R x V logits); ours samples with its own
KV-cache loop (`sample_tokens`), TRL with transformers' `generate`; TRL's value forward of the
rollout reads the untruncated responses (ours the EOS-cut ones; same shapes, same cost); TRL
logs its metrics every step (ours every `--log-every` steps) and runs `gc.collect()` twice per
step (counted in its rollout part).

The bare model work is sampling the same number of tokens with a KV cache (the plain loop of
model calls, `lit_rlhf.generation.sample_tokens`, as in bench_grpo) + reference forward + value
forward (the rollout's values) + reward-model forward (the scores) + per epoch policy and value
forward+backward, clipping, AdamW.

TRL's step time runs from the previous step's end (`on_train_begin` for the first) to its
`on_step_end` (TRL's PPO loop has no `on_step_begin`); its rollout part runs to the first
policy+value forward of the PPO epochs, the rest is the update; its generation is
`batch_generation`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from benchmarks.common import (
    TRL_TOKEN,
    BenchConfig,
    CallTimer,
    PartTimer,
    StepPeaks,
    WorkerResult,
    fit_ours,
    parse_config,
    peak_rss_mb,
    prompt_batch,
    prompt_texts,
    run_benchmark,
    token_rows,
    trl_available,
    trl_training_args,
)
from lit_rlhf.training.memory import Memory

LR = 3e-6
ADAM_EPS = 1e-5
TEMPERATURE = 0.7
KL_COEF = 0.05
CLIP = 0.2
VALUE_CLIP = 0.2
VALUE_COEF = 0.1
GAMMA = 1.0
LAM = 0.95


def _extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ppo-epochs", type=int, default=4, help="optimizer steps per rollout (K)")
    parser.add_argument("--optimizer-in-backward", action="store_true", help="ours: the module's optimizer_in_backward, "
                        "without gradient clipping (as TRL's PPO loop)")


def trl_has_ppo() -> bool:
    """Whether the installed TRL has `trl.experimental.ppo` (TRL <= 1.12), checked without importing TRL."""
    if not trl_available():
        return False
    spec = importlib.util.find_spec("trl")
    return any((Path(loc) / "experimental" / "ppo" / "ppo_trainer.py").is_file() for loc in spec.submodule_search_locations or [])


@contextlib.contextmanager
def reward_model_dir(cfg: BenchConfig, tokenizer) -> Iterator[str]:
    """A temporary directory holding the reward model both sides use: the policy's weights with a
    fresh scalar head (seeded by `cfg.seed`) as a one-label `AutoModelForSequenceClassification`."""
    from lit_rlhf import models

    with tempfile.TemporaryDirectory(prefix="lit_rlhf_bench_rm_") as path:
        torch.manual_seed(cfg.seed)  # the D11 head
        scalar = models.load_scalar_model(cfg.model, tokenizer, "float32")
        classifier, _ = models.to_sequence_classifier(scalar, tokenizer.pad_token_id)
        classifier.save_pretrained(path)
        tokenizer.save_pretrained(path)
        del scalar, classifier
        yield path


def _batches(cfg: BenchConfig, tokenizer) -> list:
    """One left-padded `PromptBatch` per step (every prompt has exactly `prompt_length` tokens)."""
    rows = token_rows(tokenizer, cfg.batch_size * cfg.total_steps, cfg.prompt_length, cfg.completion_length)
    texts = prompt_texts(tokenizer, rows)
    return [prompt_batch(tokenizer, texts[i * cfg.batch_size: (i + 1) * cfg.batch_size]) for i in range(cfg.total_steps)]


def response_token_logps(model, ids: torch.Tensor, response_length: int) -> torch.Tensor:
    """Bare-baseline per-token log-probs (N, R) of the last R tokens (logits of R positions only)."""
    logits = model(input_ids=ids, logits_to_keep=response_length + 1).logits[:, :-1] / TEMPERATURE
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, -response_length:, None]).squeeze(-1)


def ours(cfg: BenchConfig) -> WorkerResult:
    from lit_rlhf import models
    from lit_rlhf.generation import SamplingConfig, sample_tokens
    from lit_rlhf.modules import PPOModule
    from lit_rlhf.online import sources as online_rollout

    epochs = cfg.extra["ppo_epochs"]
    with reward_model_dir(cfg, models.load_tokenizer(cfg.model)) as reward_dir:
        module = PPOModule(
            model=cfg.model, reward_model=reward_dir, max_new_tokens=cfg.completion_length, temperature=TEMPERATURE,
            ppo_epochs=epochs, num_minibatches=1, kl_coef=KL_COEF, kl_estimator="k1", clip_eps=CLIP,
            value_clip_eps=VALUE_CLIP, value_coef=VALUE_COEF, gamma=GAMMA, lam=LAM, whiten_rewards=False, lr=LR,
            adam_eps=ADAM_EPS, max_grad_norm=0.0 if cfg.extra["optimizer_in_backward"] else 1.0, log_completions_every_n_steps=0,
            memory=Memory(gradient_checkpointing=cfg.gradient_checkpointing, optimizer_in_backward=cfg.extra["optimizer_in_backward"], release_host_memory=cfg.release_host_memory),
        )  # the value model starts from the reward model (D22)
    tok = module.tokenizer
    batches = _batches(cfg, tok)
    rollout_timer = CallTimer(module, "make_rollout")
    update_timer = CallTimer(module, "update")
    generate_timer = CallTimer(online_rollout, "generate_responses")  # the step's sampling only (the bare step calls sample_tokens)
    parts = PartTimer()
    sampling = SamplingConfig(max_new_tokens=cfg.completion_length, temperature=TEMPERATURE)

    def bare(batch, optimizer) -> None:
        policy, ref, value, reward = module.policy, module.ref_model, module.value_model, module.reward_model
        with parts("generate"), torch.no_grad():
            policy.eval()
            sampled = sample_tokens(policy, batch.input_ids, torch.ones_like(batch.input_ids), sampling, tok.eos_token_id,
                                    tok.pad_token_id)
            ids = torch.cat([batch.input_ids, sampled], dim=1)  # (B, P+R')
            policy.train()
        response_length = ids.shape[1] - batch.input_ids.shape[1]
        with parts("reference_and_value_forward"), torch.no_grad():
            ref_logps = response_token_logps(ref, ids, response_length)  # (B, R')
            old_values = value(ids, torch.ones_like(ids))[:, -response_length - 1: -1]  # (B, R')
        with parts("reward_forward"), torch.no_grad():
            reward.score(ids, torch.ones_like(ids))  # (B,) at the last token
        returns = old_values + torch.randn_like(old_values)
        advantages = torch.randn_like(ref_logps)
        for _ in range(epochs):
            with parts("policy_value_forward_backward"):
                logps = response_token_logps(policy, ids, response_length)
                values = value(ids, torch.ones_like(ids))[:, -response_length - 1: -1]
                ratio = torch.exp(logps - ref_logps.detach())
                loss = -(ratio * advantages).mean() + VALUE_COEF * 0.5 * (values - returns).pow(2).mean()
                loss.backward()
            with parts("optimizer_step"):
                torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        parts.end_step()

    try:
        step_times, bare_times = fit_ours(module, batches, cfg, bare, optimizer_steps_per_batch=epochs)
    finally:
        generate_timer.restore()
    peak = peak_rss_mb()
    prompt_tokens = int(batches[0].attention_mask.sum())
    return WorkerResult(
        framework="ours", step_times=step_times, peak_rss_mb=peak, optimizer_steps_per_step=epochs,
        tokens_per_step=float(prompt_tokens + cfg.batch_size * cfg.completion_length), completions_per_step=float(cfg.batch_size),
        generation_times=generate_timer.times[cfg.warmup:], rollout_times=rollout_timer.times[cfg.warmup:],
        update_times=update_timer.times[cfg.warmup:], bare_times=bare_times, bare_parts=parts.medians(cfg.warmup),
        info={"ppo_epochs": epochs, "reward": "reward model (policy weights + seeded scalar head); value model starts from it",
              "max_grad_norm": 1.0},
    )


def _trl_ppo_timer(policy_and_value_type: type):
    """A `TrainerCallback` timing TRL's PPO steps (one rollout + its PPO epochs each) and their rollout part.

    TRL's PPO `train()` calls `on_step_end` once per rollout and never `on_step_begin`: a step runs
    from the previous `on_step_end` (`on_train_begin` for the first) to its own. The rollout ends at
    the first forward of the policy+value wrapper (the PPO epochs' first micro-batch), seen through
    `wrap_forward` on TRL's module-level `forward`."""
    from transformers import TrainerCallback

    class TRLPPOStepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.rollout_times: list[float] = []
            self._started = 0.0
            self._in_rollout = True

        def on_train_begin(self, args, state, control, **kwargs):
            StepPeaks.start()
            self._started = time.perf_counter()
            self._in_rollout = True

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            self.times.append(now - self._started)
            StepPeaks.stop()
            StepPeaks.start()  # the next step starts here
            self._started = now
            self._in_rollout = True

        def wrap_forward(self, module: Any) -> Callable[[], None]:
            """Wrap `module.forward`; returns the function that puts it back."""
            inner = module.forward

            def forward(model, *args: Any, **kwargs: Any):
                if self._in_rollout and isinstance(getattr(model, "module", model), policy_and_value_type):
                    self.rollout_times.append(time.perf_counter() - self._started)
                    self._in_rollout = False
                return inner(model, *args, **kwargs)

            module.forward = forward
            return lambda: setattr(module, "forward", inner)

    return TRLPPOStepTimer()


def trl(cfg: BenchConfig) -> WorkerResult:
    from datasets import Dataset
    from torch.utils.data import DataLoader
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
    from trl.experimental.ppo import PPOConfig, PPOTrainer
    from trl.experimental.ppo import ppo_trainer as trl_ppo

    from lit_rlhf import models

    epochs = cfg.extra["ppo_epochs"]
    tokenizer = models.load_tokenizer(cfg.model, padding_side="left")  # TRL's PPO takes left-padded queries
    batches = _batches(cfg, tokenizer)
    prompts = [ids[mask].tolist() for b in batches for ids, mask in zip(b.input_ids, b.attention_mask.bool())]
    dataset = Dataset.from_dict({"input_ids": prompts})  # the very ids ours gets, in the same order
    timer = _trl_ppo_timer(trl_ppo.PolicyAndValueWrapper)
    with tempfile.TemporaryDirectory() as out, reward_model_dir(cfg, tokenizer) as reward_dir:
        weights = f"{out}/policy"
        models.load_causal_lm(cfg.model, tokenizer, "float32").save_pretrained(weights)
        tokenizer.save_pretrained(weights)
        policy = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32)
        ref = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32)
        reward = AutoModelForSequenceClassification.from_pretrained(reward_dir, dtype=torch.float32)
        value = AutoModelForSequenceClassification.from_pretrained(reward_dir, dtype=torch.float32)
        if cfg.gradient_checkpointing:  # TRL's PPO loop replaces `Trainer.train`, where the Trainer would turn it on;
            # this is what TRL's `PolicyAndValueWrapper.gradient_checkpointing_enable` does: the policy only
            policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        args = PPOConfig(
            **trl_training_args(cfg, out, learning_rate=LR, adam_epsilon=ADAM_EPS, per_device_train_batch_size=cfg.batch_size,
                                gradient_accumulation_steps=1),
            num_mini_batches=1, num_ppo_epochs=epochs, response_length=cfg.completion_length, temperature=TEMPERATURE,
            stop_token="eos", kl_coef=KL_COEF, kl_estimator="k1", cliprange=CLIP, cliprange_value=VALUE_CLIP,
            vf_coef=VALUE_COEF, gamma=GAMMA, lam=LAM, whiten_rewards=False, total_episodes=cfg.batch_size * cfg.total_steps,
            num_sample_generations=0, missing_eos_penalty=None,
        )
        trainer = PPOTrainer(
            args=args, processing_class=tokenizer, model=policy, ref_model=ref, reward_model=reward, value_model=value,
            train_dataset=dataset, callbacks=[timer],
        )
        # the same prompts in the same batches as ours (TRL's own loader shuffles)
        trainer.dataloader = DataLoader(dataset, batch_size=cfg.batch_size, shuffle=False, collate_fn=trainer.data_collator,
                                        drop_last=True)
        generate_timer = CallTimer(trl_ppo, "batch_generation")
        unwrap_forward = timer.wrap_forward(trl_ppo)
        try:
            trainer.train()
        finally:
            generate_timer.restore()
            unwrap_forward()
    if len(timer.times) != cfg.total_steps:
        raise RuntimeError(f"expected {cfg.total_steps} TRL PPO steps, timed {len(timer.times)}")
    steps = timer.times[cfg.warmup:]
    rollouts = timer.rollout_times[cfg.warmup:]
    prompt_tokens = sum(len(p) for p in prompts[: cfg.batch_size])
    return WorkerResult(
        framework="trl", step_times=steps, peak_rss_mb=peak_rss_mb(), optimizer_steps_per_step=epochs,
        tokens_per_step=float(prompt_tokens + cfg.batch_size * cfg.completion_length), completions_per_step=float(cfg.batch_size),
        generation_times=generate_timer.times[cfg.warmup:], rollout_times=rollouts,
        update_times=[s - r for s, r in zip(steps, rollouts)],
        info={"ppo_epochs": epochs, "trainer": "trl.experimental.ppo.PPOTrainer", "max_grad_norm": "none (TRL's PPO loop never clips)"},
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    args = list(sys.argv[1:] if argv is None else argv)
    trl_worker = trl
    if not trl_has_ppo():
        trl_worker = None
        cfg, ns = parse_config(args, "ppo benchmark (see benchmarks/README.md)", _extra)
        reason = (f"the installed TRL {importlib.metadata.version('trl')} has no trl.experimental.ppo.PPOTrainer "
                  "(removed in TRL 1.13)") if trl_available() else "TRL is not installed"
        hint = "use TRL 1.12.0 for the TRL side (/tmp/benchvenv-ppo, see benchmarks/README.md)"
        if not ns.worker and TRL_TOKEN in [n.strip() for n in cfg.frameworks.split(",")]:
            raise SystemExit(f"--frameworks asks for trl but {reason}: {hint}")
        if not ns.worker and cfg.frameworks == "auto" and trl_available():
            print(f"[ppo] {reason}: running ours only; {hint}", file=sys.stderr, flush=True)
    return run_benchmark("ppo", "benchmarks.bench_ppo", args, ours, trl_worker, extra=_extra)


if __name__ == "__main__":
    main()
