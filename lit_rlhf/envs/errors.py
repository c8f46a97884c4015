"""What the rollout does when an environment raises (or returns a non-observation,
`envs.base.check_observation`): a bug, unlike tool failures, which are observations.
`EnvErrorPolicy`: `stop` (default) names the rollout row and turn; `skip` drops the episode's
whole group (advantages are relative within it: `Trajectory.dropped`), warns once per rollout and
counts `rollout/env_errors` and `rollout/dropped_groups`; past `max_env_errors` over the run,
`EnvErrorBudgetExceeded` names the environment, the counts and the last exception (chained).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

log = logging.getLogger(__name__)

OnEnvError = Literal["stop", "skip"]


class EnvErrorBudgetExceeded(RuntimeError):
    """More episodes failed than `max_env_errors` allows, with `on_env_error="skip"`."""


class EnvErrorPolicy:
    """`on_env_error` and its run-wide budget (see the module docstring).

    Args:
        on_env_error: `stop` (an environment error stops the run) or `skip` (the failing
            episode's group is counted and dropped).
        max_env_errors: with `skip`, the failed episodes allowed over the run: an int (a count,
            >= 0) or a float in (0, 1] (a share of the episodes run so far, never fewer than 1).
    """

    def __init__(self, on_env_error: OnEnvError = "stop", max_env_errors: int | float = 0.1) -> None:
        if on_env_error not in ("stop", "skip"):
            raise ValueError(f"on_env_error must be 'stop' or 'skip', got {on_env_error!r}")
        if isinstance(max_env_errors, bool) or not isinstance(max_env_errors, (int, float)):
            raise TypeError(f"max_env_errors must be an int (a count) or a float (a share), got {max_env_errors!r}")
        if isinstance(max_env_errors, int) and max_env_errors < 0:
            raise ValueError(f"max_env_errors as a count must be >= 0, got {max_env_errors}")
        if isinstance(max_env_errors, float) and not 0 < max_env_errors <= 1:
            raise ValueError(f"max_env_errors as a share of the episodes must be in (0, 1], got {max_env_errors}")
        self.on_env_error, self.max_env_errors = on_env_error, max_env_errors
        self.episodes = 0  # episodes started over the run
        self.errors = 0  # episodes that failed over the run
        self.dropped_groups = 0

    @property
    def skip(self) -> bool:
        return self.on_env_error == "skip"

    def allowed(self) -> float:
        """The failed episodes the budget allows now."""
        if isinstance(self.max_env_errors, int):
            return float(self.max_env_errors)
        return max(1.0, self.max_env_errors * self.episodes)

    def start_rollout(self, episodes: int) -> None:
        self.episodes += episodes

    def record(self, environment: str, error: BaseException, dropped_group: bool) -> None:
        """Count one failed episode (and its group, when this failure drops it); past the budget,
        raise `EnvErrorBudgetExceeded` from `error`."""
        self.errors += 1
        self.dropped_groups += int(dropped_group)
        if self.errors > self.allowed():
            budget = (f"{self.max_env_errors}" if isinstance(self.max_env_errors, int)
                      else f"{self.max_env_errors:g} of {self.episodes} episodes = {self.allowed():g}")
            raise EnvErrorBudgetExceeded(
                f"{environment}: {self.errors} episodes failed ({self.errors} of {self.episodes} episodes run), more "
                f"than on_env_error='skip' allows (max_env_errors={budget}). The last error: "
                f"{type(error).__name__}: {error}") from error

    def report(self, environment: str, errors: list[BaseException], rows: int) -> None:
        """One warning for a rollout's failures."""
        if errors:
            log.warning("%s: %d of %d episodes of this rollout failed and their groups were dropped "
                        "(on_env_error='skip'; %d failed over the run, %g allowed); the last: %s: %s", environment,
                        len(errors), rows, self.errors, self.allowed(), type(errors[-1]).__name__, errors[-1])

    def state_dict(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "errors": self.errors, "dropped_groups": self.dropped_groups}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.episodes, self.errors = int(state["episodes"]), int(state["errors"])
        self.dropped_groups = int(state["dropped_groups"])
