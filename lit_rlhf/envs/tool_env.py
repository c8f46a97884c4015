"""A tool-calling environment: the policy may call tools over several turns, then answers.

`reset(row)` gives a system message describing the tools (`tool_schema`, the call format) after
the optional `system_prompt`, then the row's `prompt_column`. Each `step` runs the turn's
`<tool_call>` calls (`ToolRunner`, at most `max_calls_per_turn`) and returns one `tool` message
per call; a turn without a call is the final answer, scored by the method's reward sources. The
environment's own reward is `error_reward` per failed call (default 0: no shaping).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Literal

from lit_rlhf.envs.base import Action, Environment, Message, Observation, StepResult
from lit_rlhf.envs.tools import ToolRunner, parse_tool_calls

CALL_INSTRUCTIONS = (
    "You can call these tools:\n{tools}\n"
    "To call a tool, write <tool_call>{{\"name\": TOOL, \"arguments\": {{ARGUMENTS}}}}</tool_call> and stop; "
    "its result comes back in the next message. When you know the answer, write it without a tool call."
)


class ToolEnvironment(Environment):
    """Tools the policy may call before it answers (see the module docstring).

    Args:
        tools: the tool functions (typed, documented: `lit_rlhf.envs.tools`).
        prompt_column: the row column holding the user's message (the QA DataModules' `prompt`
            with `chat: false` is the question text).
        system_prompt: text before the tool descriptions in the system message.
        timeout: seconds a tool call may run (`ToolRunner`).
        isolation: `thread` or `process` (`ToolRunner`).
        max_calls_per_turn: calls run per policy turn; more are refused with an error observation.
        error_reward: the environment's reward for each failed call of a turn (0: none; a
            negative value discourages malformed calls).
        max_output_chars: tool outputs are cut to this many characters.
    """

    def __init__(self, tools: list[Callable], prompt_column: str = "prompt", system_prompt: str | None = None,
                 timeout: float = 5.0, isolation: Literal["thread", "process"] = "thread",
                 max_calls_per_turn: int = 4, error_reward: float = 0.0, max_output_chars: int = 1000) -> None:
        if max_calls_per_turn < 1:
            raise ValueError(f"max_calls_per_turn must be >= 1, got {max_calls_per_turn}")
        self.runner = ToolRunner(list(tools), timeout=timeout, isolation=isolation, max_output_chars=max_output_chars)
        self.prompt_column = prompt_column
        self.system_prompt = system_prompt
        self.max_calls_per_turn = max_calls_per_turn
        self.error_reward = float(error_reward)

    @property
    def tool_names(self) -> list[str]:
        return list(self.runner.tools)

    def system_message(self) -> str:
        tools = "\n".join(json.dumps(schema) for schema in self.runner.schemas())
        text = CALL_INSTRUCTIONS.format(tools=tools)
        return f"{self.system_prompt}\n\n{text}" if self.system_prompt else text

    def reset(self, row: dict[str, Any], seed: int) -> Observation:
        if self.prompt_column not in row:
            raise KeyError(f"ToolEnvironment reads the user's message from the batch column {self.prompt_column!r}; "
                           f"the batch has {sorted(row)}")
        return [{"role": "system", "content": self.system_message()},
                {"role": "user", "content": str(row[self.prompt_column])}]

    def step(self, action: Action) -> StepResult:
        parsed = parse_tool_calls(action.text)
        if not parsed:
            return StepResult(observation=None, reward=0.0, done=True)
        calls = [self.runner.call(*call) for call in parsed[: self.max_calls_per_turn]]
        messages: list[Message] = [{"role": "tool", "content": f"{call.name}: {call.output}"} for call in calls]
        if len(parsed) > self.max_calls_per_turn:
            messages.append({"role": "tool", "content": f"error: at most {self.max_calls_per_turn} tool calls per "
                                                        f"turn; {len(parsed) - self.max_calls_per_turn} not run"})
        errors = sum(call.error is not None for call in calls)
        return StepResult(observation=messages, reward=self.error_reward * errors, done=False, tool_calls=tuple(calls))

    def close(self) -> None:
        self.runner.close()

