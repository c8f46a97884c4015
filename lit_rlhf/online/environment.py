"""Multi-turn, tool-using episodes as a rollout source (`EnvironmentRollouts`).

With `rollout: {class_path: lit_rlhf.online.EnvironmentRollouts, init_args: {environment: ...}}`
an online method's rollout rows are episodes instead of single responses: the source resets one
environment instance per row (a prompt's `repeats` copies each get their own), runs up to
`max_turns` policy turns per episode with at most `max_episode_tokens` tokens after the first
prompt (`lit_rlhf.envs.rollout.run_episodes`, each turn sampled by `sampler`) and lays the
trajectories out as a `Rollout`:

- `response_ids` hold each episode after its prompt, the policy's tokens exactly as sampled and
  the environment's observation tokens after them; `response_attention_mask` is their attention
  mask (context only: no method trains on it);
- `action_mask` marks the policy's tokens: `Rollout.loss_mask`, the only mask a method trains on,
  so log-probs, the KL and advantages are on the policy's own tokens;
- `turn_rewards` puts each turn's environment reward on the turn's last policy token (PPO's
  per-token rewards keep it there); `has_eos` is False for a truncated episode;
- `meta["trajectory"]` holds the typed `Trajectory` of each row (turns, tool calls, text).

Scoring (`OnlineModule.score`): the environment's return (the sum of its turn rewards) is
the reward source `environment`, after the module's other sources; a reward function gets the
last policy turn (the answer) as its completion, with the episode's `trajectory` and
`conversation` text as columns. A reward model reads the whole episode at its last token.

A method runs episodes only if it opts in (`OnlineModule.accepts_environment`: GRPO, PPO, RLOO,
rejection sampling, the methods whose maths is one trajectory per row); any other refuses this
source at construction. Under a strategy that shards the policy across ranks (ZeRO-3, FSDP)
every rank must run the same number of forward passes, which episodes of different lengths do
not: refused at start-up.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from lightning import Trainer
from torch import Tensor

from lit_rlhf.envs.base import Environment
from lit_rlhf.envs.chat import ChatFormat
from lit_rlhf.envs.errors import EnvErrorPolicy, OnEnvError
from lit_rlhf.envs.rollout import environment_stats, run_episodes
from lit_rlhf.envs.trajectory import Trajectory, to_tensors
from lit_rlhf.generation import SamplingConfig, needs_synced_gpus
from lit_rlhf.online.correction import RolloutCorrection
from lit_rlhf.online.sources import HFSampler, Responses, RolloutSource, SampledModel
from lit_rlhf.types import PromptBatch, Rollout

TRAJECTORY = "trajectory"  # the meta column holding each row's `Trajectory`


def trajectories(rollout: Rollout) -> list[Trajectory] | None:
    """The rollout's episodes (None for single-turn rows)."""
    return rollout.meta.get(TRAJECTORY)


def dropped_rows(rollout: Rollout) -> Tensor | None:
    """(N,) bool: the rows of episode groups dropped after an environment error (None: none)."""
    found = trajectories(rollout)
    if found is None or not any(t.dropped for t in found):
        return None
    return torch.tensor([t.dropped for t in found], dtype=torch.bool, device=rollout.response_ids.device)


def episode_stats(rollout: Rollout) -> dict[str, Tensor]:
    """`rollout/...` stats of the episodes (`lit_rlhf.envs.rollout.environment_stats`); none for
    a single-turn rollout."""
    found = trajectories(rollout)
    return {} if found is None else environment_stats(found)


class EnvironmentRollouts(RolloutSource):
    """Episodes of an environment, one per rollout row (see the module docstring).

    Args:
        environment: a `lit_rlhf.envs.Environment` (e.g. `lit_rlhf.envs.ToolEnvironment` with
            tools, or the OpenEnv adapter); its return is the reward source `environment`, after
            the module's others (count it in `reward_weights`).
        max_turns: policy turns per episode at most; the module's `max_new_tokens` bounds each.
        max_episode_tokens: tokens after the first prompt per episode at most, the policy's and
            the environment's (the rollout's response width R); None = `max_turns *
            max_new_tokens`. An episode that would pass it is truncated (`has_eos` False).
        sampler: who samples each policy turn: `HFSampler` (default) or `VLLMSampler`.
        on_env_error: what an environment that raises does (`lit_rlhf.envs.errors`): `stop` the
            run (default), or `skip`: the failing episode's whole group is counted and dropped
            (no policy token to train on, every reward source 0 for its rows).
        max_env_errors: with `skip`, the failed episodes allowed over the run: an int (a count) or
            a float in (0, 1] (a share of the episodes so far); past it the run stops. Its counts
            travel in checkpoints.
    """

    multi_turn = True
    runtime = ("instances", "chat_format")

    def __init__(self, environment: Environment, max_turns: int = 1, max_episode_tokens: int | None = None,
                 sampler: RolloutSource | None = None, on_env_error: OnEnvError = "stop",
                 max_env_errors: int | float = 0.1) -> None:
        if not isinstance(environment, Environment):
            raise TypeError(f"environment must be a lit_rlhf.envs.Environment, got {type(environment).__name__}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if max_episode_tokens is not None and max_episode_tokens < 1:
            raise ValueError(f"max_episode_tokens must be >= 1 or null (max_turns * max_new_tokens), got {max_episode_tokens}")
        sampler = HFSampler() if sampler is None else sampler
        if sampler.asynchronous or sampler.multi_turn:
            raise ValueError(f"EnvironmentRollouts samples each turn in the training step: its sampler must be "
                             f"HFSampler or VLLMSampler, got {sampler.describe()}")
        self.environment, self.max_turns, self.max_episode_tokens = environment, int(max_turns), max_episode_tokens
        self.sampler = sampler
        self.env_errors = EnvErrorPolicy(on_env_error, max_env_errors)
        self.instances: list[Environment] | None = None
        self.chat_format: ChatFormat | None = None

    @property
    def correction(self) -> RolloutCorrection | None:  # the turns' sampler decides
        return self.sampler.correction

    def episode_budget(self, sampling: SamplingConfig) -> int:
        """The rollout's response width: `max_episode_tokens`, else `max_turns * max_new_tokens`."""
        if self.max_episode_tokens is not None:
            return int(self.max_episode_tokens)
        return self.max_turns * sampling.max_new_tokens

    def problems(self, trainer: Trainer | None, method: type, resamples: bool = False) -> list[str]:
        if needs_synced_gpus(trainer):
            return ["EnvironmentRollouts: an environment runs episodes of different lengths on each rank, which a "
                    "strategy that shards the policy (ZeRO-3, FSDP) cannot generate with: use DDP or ZeRO-2"]
        return self.sampler.problems(trainer, method, resamples)

    def sibling(self, name: str) -> "EnvironmentRollouts":
        """Episodes of the frozen model `name`: its turns from the turn sampler's sibling, its own instances."""
        twin = copy.copy(self)
        twin.sampler, twin.instances, twin.siblings = self.sampler.for_model(name), None, {}
        return twin

    def generate(self, model: SampledModel, prompt_ids: Tensor, prompt_mask: Tensor,
                 sampling: SamplingConfig) -> Responses:
        return self.sampler.generate(model, prompt_ids, prompt_mask, sampling)

    def state_dict(self) -> dict[str, Any]:
        return {"env_errors": self.env_errors.state_dict()}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is not None:
            self.env_errors.load_state_dict(state["env_errors"])

    def fork_instances(self, n: int) -> list[Environment]:
        """`n` environment instances, one per episode (`Environment.fork`), kept from rollout to
        rollout (each episode starts with `reset`)."""
        if self.instances is None:
            self.instances = []
        while len(self.instances) < n:
            self.instances.append(self.environment.fork())
        return self.instances[:n]

    def sample(self, model: SampledModel, batch: PromptBatch, repeats: int, sampling: SamplingConfig,
               training: bool = True) -> tuple[Rollout, dict[str, Tensor]]:
        """One episode per row (`repeats` per prompt, contiguous) -> the rollout, without
        log-probs or scores."""
        tokenizer = model.tokenizer
        if self.chat_format is None:
            self.chat_format = ChatFormat(tokenizer)
        prompt_ids, prompt_mask = batch.input_ids, batch.attention_mask.bool()  # (B, P)
        row_prompts = [ids[m].tolist() for ids, m in zip(prompt_ids, prompt_mask) for _ in range(repeats)]
        meta = {k: [x for x in v for _ in range(repeats)] for k, v in batch.meta.items()}
        n = len(row_prompts)
        rows = [{k: v[i] for k, v in meta.items()} for i in range(n)]
        seeds = torch.randint(0, 2**31 - 1, (n,)).tolist()  # from the restored generator: replayed on resume
        budget = self.episode_budget(sampling)

        def generate(ids: Tensor, mask: Tensor, turn_sampling: SamplingConfig) -> Responses:
            return self.sampler.generate(model, ids, mask, turn_sampling)

        found = run_episodes(self.fork_instances(n), rows, seeds, row_prompts, generate, self.chat_format,
                             sampling, self.max_turns, budget, device=prompt_ids.device, group_size=repeats,
                             env_errors=self.env_errors)
        t = to_tensors(found, budget, tokenizer.pad_token_id, prompt_ids.device)
        meta = {**meta, TRAJECTORY: found, "conversation": [trajectory.conversation(tokenizer) for trajectory in found]}
        rollout = Rollout(t.prompt_ids, t.prompt_mask, t.response_ids, t.response_mask, t.has_eos, None, meta=meta,
                          sampler_logps=t.sampler_logps, action_mask=t.action_mask, turn_rewards=t.turn_rewards)
        return rollout, {}


def log_conversations(rollout: Rollout, tokenizer: Any, experiment: Any, k: int, step: int) -> None:
    """Sample episodes as a TensorBoard text table (`train/conversations`): the prompt's end, the
    episode's text (policy and environment turns), turns, tool errors, stop reason, score."""
    found = trajectories(rollout)
    if found is None:
        return

    def cell(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", "<br>")

    rows = ["| prompt (end) | episode | turns | tool errors | stop | score |", "|---|---|---|---|---|---|"]
    prompts = tokenizer.batch_decode([ids[m].tolist() for ids, m in zip(rollout.prompt_ids[:k], rollout.prompt_mask[:k])])
    for prompt, text, t, score in zip(prompts, rollout.meta["conversation"][:k], found[:k], rollout.scores[:k].tolist()):
        errors = sum(call.error is not None for call in t.tool_calls)
        rows.append(f"| {cell(prompt[-200:])} | {cell(text)} | {len(t.turns)} | {errors} | {t.stop_reason} | {score:.3f} |")
    experiment.add_text("train/conversations", "\n".join(rows), step)
