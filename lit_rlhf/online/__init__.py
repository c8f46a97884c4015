"""The online machinery of `OnlineModule`: where a rollout comes from and how the update runs.

- rollout sources, the `rollout:` argument of every online module: `HFSampler` (default,
  `sources`), `VLLMSampler` (`vllm_source`), `AsyncRollouts` with an optional
  `VLLMServerBackend` (`async_source`, `server`), `EnvironmentRollouts` (`environment`);
- `correction`: a source's correction for its sampler (`RolloutCorrection`) and its statistics;
- `update`: the pure helpers of passes over minibatches of whole groups with exact gradient
  accumulation (the loop itself is `OnlineModule.run_updates`).
"""

from lit_rlhf.online.async_source import ASYNC_TIS_CAP, AsyncRollouts
from lit_rlhf.online.correction import RolloutCorrection
from lit_rlhf.online.environment import EnvironmentRollouts
from lit_rlhf.online.server import VLLMServerBackend
from lit_rlhf.online.sources import HFSampler, RolloutSource
from lit_rlhf.online.vllm_source import VLLMSampler

__all__ = ["ASYNC_TIS_CAP", "AsyncRollouts", "EnvironmentRollouts", "HFSampler", "RolloutCorrection", "RolloutSource",
           "VLLMSampler", "VLLMServerBackend"]
