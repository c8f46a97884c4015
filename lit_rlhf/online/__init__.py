"""The online machinery: where a rollout comes from, how it is scored and how the update runs.

- rollout sources (`sources`, `async_source`, `server`, `environment`): the `rollout:` argument
  of every online module: `HFSampler` (default), `VLLMSampler`, `AsyncRollouts` (with an optional
  `VLLMServerBackend`), `EnvironmentRollouts`;
- `correction`: a source's correction for its sampler (`RolloutCorrection`) and its statistics;
- `scoring`: the reward sources on a rollout and the objective statistics;
- `rollout`: one rollout of an online module (sample, score once, reward) and a step's statistics;
- `lifecycle`: an online module's set-up, start and checkpoint state in a fit;
- `hooks`: the callbacks' rollout hooks;
- `update`: passes over minibatches of whole groups with exact gradient accumulation;
- `budget`: episodes, the episode budget and the schedule's length.
"""

from lit_rlhf.online.async_source import ASYNC_TIS_CAP, AsyncRollouts
from lit_rlhf.online.correction import RolloutCorrection
from lit_rlhf.online.environment import EnvironmentRollouts
from lit_rlhf.online.server import VLLMServerBackend
from lit_rlhf.online.sources import HFSampler, RolloutSource, VLLMSampler

__all__ = ["ASYNC_TIS_CAP", "AsyncRollouts", "EnvironmentRollouts", "HFSampler", "RolloutCorrection", "RolloutSource",
           "VLLMSampler",
           "VLLMServerBackend"]
