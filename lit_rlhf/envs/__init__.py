"""Environments for multi-turn, tool-using rollouts of the online methods (`docs/guides/environments.md`).

`base`: the protocol (`Environment.reset(row, seed)`, `step(Action) -> StepResult`) and its
values; `tools`: tools as typed, documented callables (`tool_schema`), the `<tool_call>` format
(`parse_tool_calls`) and `ToolRunner` (time limits, errors as observations; `worker` runs its
`process` isolation); `tool_env`: `ToolEnvironment`; `calculator`: the `calculator` tool;
`openenv`: `OpenEnvEnvironment`; `chat`: observations as token ids (`ChatFormat`); `trajectory`,
`rollout`: the trajectory and the batched episode loop; `errors`: `EnvErrorPolicy`;
`demonstrations`: demonstrated episodes as SFT data (`DemonstrationDataModule`).
`trajectory`, `rollout` and `demonstrations` import torch and are not imported here; the other
modules do not, so a tool worker process starts without it.
"""

from lit_rlhf.envs.base import Action, Environment, Message, Observation, StepResult, ToolCall
from lit_rlhf.envs.calculator import calculator
from lit_rlhf.envs.chat import ChatFormat
from lit_rlhf.envs.errors import EnvErrorBudgetExceeded, EnvErrorPolicy
from lit_rlhf.envs.tool_env import ToolEnvironment
from lit_rlhf.envs.tools import ToolRunner, parse_tool_calls, tool_schema

__all__ = [
    "Action", "ChatFormat", "EnvErrorBudgetExceeded", "EnvErrorPolicy", "Environment", "Message", "Observation",
    "StepResult", "ToolCall", "ToolEnvironment", "ToolRunner", "calculator", "parse_tool_calls", "tool_schema"
]
