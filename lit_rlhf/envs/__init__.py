"""Environments for multi-turn, tool-using rollouts of the online methods.

- `base`: the protocol (`Environment.reset(row, seed) -> Observation`, `step(Action) ->
  StepResult`) and its typed values (`Action`, `StepResult`, `ToolCall`);
- `tools`: tools as typed, documented Python callables (`tool_schema`), the call format
  (`<tool_call>{json}</tool_call>`, `parse_tool_calls`) and `ToolRunner` (time limits, errors as
  observations); `worker`: the process its `process` isolation runs calls in;
- `tool_env`: `ToolEnvironment`, tools the policy calls over several turns before it answers;
- `calculator`: the `calculator` tool;
- `openenv`: `OpenEnvEnvironment`, an OpenEnv (`openenv-core`) environment run in-process;
- `chat`: observations as token ids appended after the sampled ones (`ChatFormat`);
- `trajectory` and `rollout`: the typed multi-turn trajectory and the batched episode loop
  that the online modules call; `errors`: what the loop does when an environment raises
  (`EnvErrorPolicy`: stop, or drop the episode's group within a budget);
- `demonstrations`: demonstrated episodes as SFT data (`DemonstrationDataModule`), the stage
  that teaches an environment's format before RL.
`trajectory`, `rollout` and `demonstrations` import torch and are not imported here; this
package's other modules do not, so a tool worker process starts without it.
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
