"""The environment side of `OnlineModule`: multi-turn, tool-using episodes as a rollout.

With an `environment` (`lit_rlhf.envs`), step 1 of an online method's training step
(`lit_rlhf.modules.online`) runs episodes instead of sampling one response per prompt:
`episode_rollout` resets one environment instance per rollout row (a prompt's `repeats` copies
each get their own), runs up to `max_turns` policy turns per episode with at most
`max_episode_tokens` tokens after the first prompt (`lit_rlhf.envs.rollout.run_episodes`, on
the module's generation backend) and lays the trajectories out as a `Rollout`:

- `response_ids` hold each episode after its prompt, the policy's tokens exactly as sampled and
  the environment's observation tokens after them; `response_mask` is their attention mask;
- `action_mask` marks the policy's tokens: `Rollout.loss_mask`, which every method trains on, so
  log-probs, the KL and advantages are on the policy's own tokens and environment tokens are
  masked out of the loss;
- `turn_rewards` puts each turn's environment reward on the turn's last policy token (PPO's
  per-token rewards keep it there); `has_eos` is False for a truncated episode;
- `meta["trajectory"]` holds the typed `Trajectory` of each row (turns, tool calls, text).

Scoring (`RolloutMixin.score_rollout`): the environment's return (the sum of its turn rewards)
is the reward source `environment`, after the module's other sources; a reward function gets
the last policy turn (the answer) as its completion, with the episode's `trajectory` and
`conversation` text as columns. A reward model reads the whole episode at its last token.

Under a strategy that shards the policy across ranks (ZeRO-3, FSDP) every rank must run the
same number of forward passes, which episodes of different lengths do not: refused at start-up.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_rlhf.envs.base import Environment
from lit_rlhf.envs.chat import ChatFormat
from lit_rlhf.envs.rollout import environment_stats, run_episodes
from lit_rlhf.envs.trajectory import Trajectory, to_tensors
from lit_rlhf.generation import SamplingConfig
from lit_rlhf.types import PromptBatch, Rollout

TRAJECTORY = "trajectory"  # the meta column holding each row's `Trajectory`


class EnvironmentMixin:
    """Multi-turn episodes for an `OnlineModule` (see the module docstring)."""

    environment: Environment | None = None
    max_turns: int = 1
    max_episode_tokens: int = 0
    supports_environment = True  # False: the method's maths is not the one-trajectory path (refused)

    def init_environment(self, environment: Environment | None, max_turns: int, max_episode_tokens: int | None,
                         max_new_tokens: int) -> None:
        """In `__init__`: check and keep the environment settings (`OnlineModule`'s arguments)."""
        if environment is None:
            return
        if not isinstance(environment, Environment):
            raise TypeError(f"environment must be a lit_rlhf.envs.Environment, got {type(environment).__name__}")
        if not self.supports_environment:
            raise ValueError(f"{type(self).__name__} does not run environments: multi-turn episodes are for the "
                             "methods that train on one trajectory per row (GRPO, PPO, RLOO, rejection sampling)")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        budget = max_turns * max_new_tokens if max_episode_tokens is None else int(max_episode_tokens)
        if budget < 1:
            raise ValueError(f"max_episode_tokens must be >= 1 or null (max_turns * max_new_tokens), got {budget}")
        self.environment, self.max_turns, self.max_episode_tokens = environment, int(max_turns), budget
        self._episode_envs: list[Environment] = []
        self._chat_format: ChatFormat | None = None

    def episode_envs(self, n: int) -> list[Environment]:
        """`n` environment instances, one per episode of a rollout (`Environment.fork`), kept
        from rollout to rollout (each episode starts with `reset`)."""
        while len(self._episode_envs) < n:
            self._episode_envs.append(self.environment.fork())
        return self._episode_envs[:n]

    def episode_rollout(self, batch: PromptBatch, meta: dict[str, list[Any]], repeats: int,
                        sampling: SamplingConfig) -> Rollout:
        """Run one episode per row (`repeats` per prompt, contiguous) -> the rollout, without
        log-probs or scores (see the module docstring)."""
        if self._chat_format is None:
            self._chat_format = ChatFormat(self.tokenizer)
        prompt_ids, prompt_mask = batch.input_ids, batch.attention_mask.bool()  # (B, P)
        row_prompts = [ids[m].tolist() for ids, m in zip(prompt_ids, prompt_mask) for _ in range(repeats)]
        n = len(row_prompts)
        rows = [{k: v[i] for k, v in meta.items()} for i in range(n)]
        seeds = torch.randint(0, 2**31 - 1, (n,)).tolist()  # from the restored generator: replayed on resume
        trajectories = run_episodes(self.episode_envs(n), rows, seeds, row_prompts, self.generate, self._chat_format,
                                    sampling, self.max_turns, self.max_episode_tokens, device=prompt_ids.device)
        t = to_tensors(trajectories, self.max_episode_tokens, self.tokenizer.pad_token_id, prompt_ids.device)
        meta = {**meta, TRAJECTORY: trajectories,
                "conversation": [trajectory.conversation(self.tokenizer) for trajectory in trajectories]}
        return Rollout(t.prompt_ids, t.prompt_mask, t.response_ids, t.response_mask, t.has_eos, None, meta=meta,
                       sampler_logps=t.sampler_logps, action_mask=t.action_mask, turn_rewards=t.turn_rewards)

    @staticmethod
    def trajectories(rollout: Rollout) -> list[Trajectory] | None:
        return rollout.meta.get(TRAJECTORY)

    def episode_stats(self, rollout: Rollout) -> dict[str, Tensor]:
        """`rollout/...` stats of the episodes (`lit_rlhf.envs.rollout.environment_stats`); none
        for a single-turn rollout."""
        trajectories = self.trajectories(rollout)
        return {} if trajectories is None else environment_stats(trajectories)

    def log_conversations(self, rollout: Rollout, experiment: Any, k: int) -> None:
        """Sample episodes as a TensorBoard text table (`train/conversations`): the prompt's
        end, the episode's text (policy and environment turns), turns, tool errors, stop reason,
        score."""
        trajectories = self.trajectories(rollout)
        if trajectories is None:
            return

        def cell(s: str) -> str:
            return s.replace("|", "\\|").replace("\n", "<br>")

        rows = ["| prompt (end) | episode | turns | tool errors | stop | score |", "|---|---|---|---|---|---|"]
        prompts = self.tokenizer.batch_decode([ids[m].tolist() for ids, m in zip(rollout.prompt_ids[:k],
                                                                                 rollout.prompt_mask[:k])])
        for prompt, text, t, score in zip(prompts, rollout.meta["conversation"][:k], trajectories[:k],
                                          rollout.scores[:k].tolist()):
            errors = sum(call.error is not None for call in t.tool_calls)
            rows.append(f"| {cell(prompt[-200:])} | {cell(text)} | {len(t.turns)} | {errors} | {t.stop_reason} "
                        f"| {score:.3f} |")
        experiment.add_text("train/conversations", "\n".join(rows), self.global_step)

    def environment_problems(self, trainer: Any) -> list[str]:
        """Start-up problems of the environment settings under `trainer`'s strategy."""
        from lit_rlhf.generation import needs_synced_gpus

        if self.environment is not None and needs_synced_gpus(trainer):
            return ["an environment runs episodes of different lengths on each rank, which a strategy that shards "
                    "the policy (ZeRO-3, FSDP) cannot generate with: use DDP or ZeRO-2"]
        return []
