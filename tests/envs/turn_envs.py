"""Environments for the tests (importable by dotted path from a YAML config)."""

from __future__ import annotations

from typing import Any

from lit_rlhf.envs import Action, Environment, StepResult


class CountingEnv(Environment):
    """Answers every policy turn with a `user` message "turn k of N: go on" until the policy has
    taken `turns` turns; each turn's reward is the fraction of its characters in `chars`
    (`reward_scale` times it). Its first observation is the row's prompt (None: as encoded by
    the DataModule) unless `prompt_column` is set."""

    def __init__(self, turns: int = 3, chars: str = "aeiou ", reward_scale: float = 1.0,
                 prompt_column: str | None = None) -> None:
        self.turns, self.chars, self.reward_scale, self.prompt_column = turns, set(chars), reward_scale, prompt_column
        self.taken = 0
        self.seed = None

    def reset(self, row: dict[str, Any], seed: int):
        self.taken, self.seed = 0, seed
        if self.prompt_column is None:
            return None
        return [{"role": "user", "content": str(row[self.prompt_column])}]

    def step(self, action: Action) -> StepResult:
        self.taken += 1
        text = action.text
        reward = self.reward_scale * (sum(c in self.chars for c in text) / len(text) if text else 0.0)
        if self.taken >= self.turns:
            return StepResult(reward=reward, done=True)
        return StepResult(observation=[{"role": "user", "content": f"turn {self.taken} of {self.turns}: go on"}],
                          reward=reward)


class FlakyEnv(CountingEnv):
    """`CountingEnv` whose `step` raises on the rows with `fail_at` set, at that policy turn (and
    whose `reset` raises when it is 0)."""

    def reset(self, row: dict[str, Any], seed: int):
        self.fail_at = row.get("fail_at")
        if self.fail_at == 0:
            raise ConnectionError("the environment's server is gone")
        return super().reset(row, seed)

    def step(self, action: Action) -> StepResult:
        if self.fail_at == self.taken + 1:
            raise ValueError(f"boom at turn {self.fail_at}")
        return super().step(action)
