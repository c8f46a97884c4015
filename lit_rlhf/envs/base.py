"""The environment protocol: what an online method's multi-turn rollout talks to
(`docs/guides/environments.md`).

An episode is `reset(row, seed) -> Observation` once (the row's `meta` columns; `seed` is drawn
from torch's generator by the rollout, so a `random.Random(seed)` environment replays on resume;
the observation is chat messages, text, or None = the row's prompt as the DataModule encoded it),
then `step(action) -> StepResult` (the policy's sampled ids and their text; the answer holds the
observation to append, the turn's reward, `done` and the tool calls run) until `done` or a budget
runs out (`lit_rlhf.envs.rollout`). Observations are appended after the policy's tokens as new
tokens (`lit_rlhf.envs.chat`). A single-turn prompt with a reward is the one-step environment.
The rollout holds one instance per row (`fork()`, a deep copy by default).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Union

Message = dict[str, str]  # {"role": ..., "content": ...}
Observation = Union[list[Message], str, None]


@dataclass(frozen=True)
class ToolCall:
    """One tool call the policy made and what came of it.

    `error` is None for a call that ran and returned usable output, else its kind: `parse`
    (the call's text is not a well-formed call), `unknown_tool`, `bad_arguments` (missing,
    unexpected or mistyped arguments), `raised` (the tool raised), `timeout` (it ran past its
    time limit) or `bad_output` (it returned something that is not text, a number, a bool or
    JSON-serialisable data). `output` is what the policy is shown: the tool's output or the
    error message."""

    name: str
    arguments: Any
    output: str
    error: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class Action:
    """The policy's turn: the token ids as sampled (EOS included when it ended the turn) and
    their decoded text (EOS excluded)."""

    text: str
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class StepResult:
    """What the environment returns after a policy turn."""

    observation: Observation = None
    reward: float = 0.0
    done: bool = False
    tool_calls: tuple[ToolCall, ...] = ()
    info: dict[str, Any] = field(default_factory=dict)


class Environment:
    """Base class of the environments the multi-turn rollout drives (see the module docstring).

    Subclasses implement `reset` and `step`; an environment holding resources that cannot be
    deep-copied overrides `fork`. `close` releases them at the end of a run."""

    def reset(self, row: dict[str, Any], seed: int) -> Observation:
        raise NotImplementedError

    def step(self, action: Action) -> StepResult:
        raise NotImplementedError

    def fork(self) -> "Environment":
        """A fresh instance for another concurrent episode."""
        return copy.deepcopy(self)

    def close(self) -> None:
        """Release what the environment holds (processes, connections); nothing by default."""


def safe_text(text: str) -> str:
    """`text` with every lone surrogate (a code point U+D800-U+DFFF that is not half of a valid
    pair: what `bytes.decode(..., "surrogateescape")` or a bad `chr` leaves) replaced by U+FFFD,
    so a tokenizer and a logger can encode it; a pair written as two code points is joined."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def check_observation(observation: Any, where: str) -> Observation:
    """`observation` if it is a valid `Observation`, else a TypeError naming `where`."""
    if observation is None or isinstance(observation, str):
        return observation
    if isinstance(observation, list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in observation):
        return observation
    raise TypeError(f"{where} must return chat messages ([{{'role': str, 'content': str}}, ...]), a string or "
                    f"None, got {type(observation).__name__}: {str(observation)[:200]!r}")
