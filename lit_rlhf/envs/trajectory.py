"""The typed multi-turn trajectory, and a batch of them as the tensors of a `Rollout`.

An episode after its first prompt is one flat list of ids, `prompt | turn 1 | observation 1 |
... | turn k`, the turns as sampled, `policy_mask` True on them; `Turn` records where each turn's
tokens lie, its reward and tool calls. `to_tensors` lays a batch out as a `Rollout`: prompts left
padded (P), the rest right padded to the budget R; `response_mask` (N, R) on every real token
(each policy token scored in its sampled context); `action_mask` (N, R) on the policy's tokens
(the loss mask); `turn_rewards` (N, R) on each turn's last policy token; `has_eos` (N,) False when
truncated (D23); `dropped` (N,) for a group dropped after an environment raised: it trains on
nothing, its scores for the caller to set to a finite placeholder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from lit_rlhf.envs.base import ToolCall


@dataclass
class Turn:
    """One policy turn and the observation after it: policy tokens `[start, end)` and
    observation tokens `[end, observation_end)` of `Trajectory.token_ids`."""

    start: int
    end: int
    observation_end: int
    reward: float = 0.0
    text: str = ""
    observation: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass
class Trajectory:
    """One episode (see the module docstring). `sampler_logps` holds the sampling engine's
    log-prob of each policy token (0 on environment tokens) when the backend reports them.
    `tools` names the tools the episode's environment offers (its `tool_names`), so a tool the
    policy never called is still counted, with 0 calls. `group` is the episode's group (a
    prompt's copies, contiguous rows); `dropped` marks an episode of a group dropped because
    one of its episodes' environment raised (`lit_rlhf.envs.errors`), and `error` is that
    environment's error on the episode that raised: a dropped episode trains on nothing
    (`to_tensors`) and its environment return is 0."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    policy_mask: list[bool] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    sampler_logps: list[float] | None = None
    done: bool = False
    truncated: bool = False
    stop_reason: str = ""  # done | turn_limit | token_budget | no_eos | env_error | dropped
    tools: tuple[str, ...] = ()
    group: int = 0
    dropped: bool = False
    error: str = ""

    def add_policy_tokens(self, ids: list[int], logps: list[float] | None = None) -> Turn:
        start = len(self.token_ids)
        self.token_ids += ids
        self.policy_mask += [True] * len(ids)
        if logps is not None:
            self.sampler_logps = (self.sampler_logps or [0.0] * start) + list(logps)
        elif self.sampler_logps is not None:
            self.sampler_logps += [0.0] * len(ids)
        turn = Turn(start, len(self.token_ids), len(self.token_ids))
        self.turns.append(turn)
        return turn

    def add_observation_tokens(self, ids: list[int]) -> None:
        self.token_ids += ids
        self.policy_mask += [False] * len(ids)
        if self.sampler_logps is not None:
            self.sampler_logps += [0.0] * len(ids)
        self.turns[-1].observation_end = len(self.token_ids)

    @property
    def reward(self) -> float:
        """The environment's return: the sum of the turn rewards (0 for a dropped episode)."""
        return 0.0 if self.dropped else float(sum(t.reward for t in self.turns))

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [call for turn in self.turns for call in turn.tool_calls]

    @property
    def num_policy_tokens(self) -> int:
        return sum(self.policy_mask)

    @property
    def num_env_tokens(self) -> int:
        return len(self.policy_mask) - self.num_policy_tokens

    @property
    def final_text(self) -> str:
        """The text of the last policy turn (the answer of an episode that ended)."""
        return self.turns[-1].text if self.turns else ""

    def conversation(self, tokenizer) -> str:
        """The episode after its prompt as text, decoded from its token ids."""
        return tokenizer.decode(self.token_ids, skip_special_tokens=False)


class TrajectoryTensors(NamedTuple):
    """A batch of trajectories as rollout tensors (shapes in the module docstring)."""

    prompt_ids: Tensor  # (N, P) long, left padded
    prompt_mask: Tensor  # (N, P) bool
    response_ids: Tensor  # (N, R) long, right padded with PAD
    response_mask: Tensor  # (N, R) bool, every real token after the prompt
    action_mask: Tensor  # (N, R) bool, the policy's tokens
    has_eos: Tensor  # (N,) bool, the episode ended within its budgets
    turn_rewards: Tensor  # (N, R) float32, each turn's reward on its last policy token
    sampler_logps: Tensor | None  # (N, R) float32, 0 off the policy's tokens; None without them
    dropped: Tensor | None = None  # (N,) bool, the episode's group was dropped (an environment error)


def to_tensors(trajectories: list[Trajectory], width: int, pad_token_id: int,
               device: torch.device | str = "cpu") -> TrajectoryTensors:
    """Lay `trajectories` out as rollout tensors with R = `width` response columns."""
    n = len(trajectories)
    prompt_width = max(len(t.prompt_ids) for t in trajectories)
    prompt_ids = torch.full((n, prompt_width), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, prompt_width), dtype=torch.bool)
    response_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((n, width), dtype=torch.bool)
    action_mask = torch.zeros((n, width), dtype=torch.bool)
    turn_rewards = torch.zeros((n, width), dtype=torch.float32)
    with_logps = any(t.sampler_logps is not None for t in trajectories)
    sampler = torch.zeros((n, width), dtype=torch.float32) if with_logps else None
    for i, t in enumerate(trajectories):
        if len(t.token_ids) > width:
            raise ValueError(f"episode {i} has {len(t.token_ids)} tokens after its prompt, more than the budget {width}")
        p, r = len(t.prompt_ids), len(t.token_ids)
        prompt_ids[i, prompt_width - p:] = torch.tensor(t.prompt_ids, dtype=torch.long)
        prompt_mask[i, prompt_width - p:] = True
        if r:
            response_ids[i, :r] = torch.tensor(t.token_ids, dtype=torch.long)
            response_mask[i, :r] = True
        if t.dropped:  # context only: no policy token, reward or sampler log-prob to train on
            continue
        if r:
            action_mask[i, :r] = torch.tensor(t.policy_mask, dtype=torch.bool)
        for turn in t.turns:
            if turn.end > turn.start:
                turn_rewards[i, turn.end - 1] += turn.reward
        if sampler is not None and t.sampler_logps is not None:
            sampler[i, :r] = torch.tensor(t.sampler_logps, dtype=torch.float32)
    has_eos = torch.tensor([t.done and not t.truncated and not t.dropped for t in trajectories], dtype=torch.bool)
    dropped = torch.tensor([t.dropped for t in trajectories], dtype=torch.bool)
    move = (lambda x: x.to(device)) if str(device) != "cpu" else (lambda x: x)
    return TrajectoryTensors(move(prompt_ids), move(prompt_mask), move(response_ids), move(response_mask),
                             move(action_mask), move(has_eos), move(turn_rewards),
                             None if sampler is None else move(sampler), move(dropped))
