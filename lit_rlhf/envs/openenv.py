"""An OpenEnv environment (`openenv-core`, optional: `pip install -e .[openenv]`) run in-process.

OpenEnv environments are servers with `reset(seed=...)` and `step(Action)` returning typed
(pydantic) observations with `reward` and `done`. `OpenEnvEnvironment` calls them directly (no
HTTP): the policy's turn text becomes the action's `action_field`; an observation becomes a chat
message (its `observation_field`, or its env-specific fields as JSON) with its `reward` (None = 0)
and `done`; the first prompt is the row's `prompt_column` and the reset observation.
"""

from __future__ import annotations

import importlib
import json
import typing
from typing import Any

from lit_rlhf.envs.base import Action, Environment, Observation, StepResult

_BASE_FIELDS = {"done", "reward", "metadata"}


def _import_openenv():
    try:
        from openenv.core import env_server
    except ImportError as err:  # pragma: no cover - depends on the installation
        raise ImportError("OpenEnvEnvironment needs the openenv-core package: pip install -e .[openenv]") from err
    return env_server


def _load(path: str) -> Any:
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"expected a dotted path module.Name, got {path!r}")
    return getattr(importlib.import_module(module), name)


def action_class_of(env_class: type) -> type:
    """The action type `ActT` of an `Environment[ActT, ObsT, StateT]` subclass."""
    server = _import_openenv()
    for klass in env_class.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(base) is server.Environment:
                action = typing.get_args(base)[0]
                if isinstance(action, type):
                    return action
    raise TypeError(f"{env_class.__name__} does not declare its action type (Environment[ActT, ObsT, StateT]): "
                    "give action_class")


class OpenEnvEnvironment(Environment):
    """An in-process OpenEnv environment (see the module docstring).

    Args:
        env: the OpenEnv environment: an instance of an `openenv.core.env_server.Environment`
            subclass, or its class as a dotted path (built with `env_kwargs`).
        env_kwargs: keyword arguments of the class when `env` is a path.
        action_class: the action type (dotted path or class); default: the environment's `ActT`.
        action_field: the action field that receives the policy's turn text.
        observation_field: the observation field shown to the policy; None = every
            env-specific field, as JSON.
        observation_role: the chat role of the observation messages.
        prompt_column: the row column put before the reset observation's text (None: none).
        system_prompt: an optional system message.
    """

    def __init__(self, env: Any, env_kwargs: dict[str, Any] | None = None, action_class: Any = None,
                 action_field: str = "message", observation_field: str | None = None, observation_role: str = "user",
                 prompt_column: str | None = "prompt", system_prompt: str | None = None) -> None:
        server = _import_openenv()
        if isinstance(env, str):
            env = _load(env)(**(env_kwargs or {}))
        if not isinstance(env, server.Environment):
            raise TypeError(f"env must be an openenv.core.env_server.Environment, got {type(env).__name__}")
        self.env = env
        action_class = _load(action_class) if isinstance(action_class, str) else action_class
        self.action_class = action_class or action_class_of(type(env))
        fields = getattr(self.action_class, "model_fields", {})
        if action_field not in fields:
            raise ValueError(f"{self.action_class.__name__} has no field {action_field!r} (fields: {sorted(fields)})")
        self.action_field, self.observation_field = action_field, observation_field
        self.observation_role, self.prompt_column, self.system_prompt = observation_role, prompt_column, system_prompt

    def observation_text(self, observation: Any) -> str:
        if self.observation_field is not None:
            return str(getattr(observation, self.observation_field))
        data = observation.model_dump() if hasattr(observation, "model_dump") else dict(vars(observation))
        return json.dumps({k: v for k, v in data.items() if k not in _BASE_FIELDS}, default=str)

    def reset(self, row: dict[str, Any], seed: int) -> Observation:
        text = self.observation_text(self.env.reset(seed=seed))
        if self.prompt_column is not None:
            if self.prompt_column not in row:
                raise KeyError(f"OpenEnvEnvironment reads the prompt from the batch column {self.prompt_column!r}; "
                               f"the batch has {sorted(row)}")
            text = f"{row[self.prompt_column]}\n\n{text}" if text else str(row[self.prompt_column])
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + [{"role": "user", "content": text}]

    def step(self, action: Action) -> StepResult:
        observation = self.env.step(self.action_class(**{self.action_field: action.text}))
        reward = float(observation.reward or 0.0)
        done = bool(observation.done)
        message = None if done else [{"role": self.observation_role, "content": self.observation_text(observation)}]
        return StepResult(observation=message, reward=reward, done=done)

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()
