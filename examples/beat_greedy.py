"""A new online method in a few dozen lines: "beat the greedy" filtered SFT. Sample G responses
per prompt, keep those whose reward beats the policy's own greedy response to the prompt by
`margin`, and fine-tune on them (token-mean NLL): a self-improvement filter in the spirit of
ReST (Gulcehre et al. 2023) and RAFT (Dong et al. 2023), with ReMax's greedy baseline (Li et al.
2023) as the bar.

It uses each extension point of `OnlineModule`: `repeats` (responses per prompt), settings as
init arguments kept as attributes, `check_config` (start-up checks of its own settings),
`rollout_extras` (per-row data computed in the rollout, read in the update), `needs_rollout_logps`
(the rollout computes no log-probs it does not need), a base setting pinned in its
`super().__init__` call (`logprob_temperature`: the temperature of the log-probs it trains on),
`updates_per_rollout` (1, the default) and `update` with `run_updates` (minibatches,
accumulation, clipping, the schedule). Sampling (`hf` or `vllm`), reward sources, the rollout
hooks (D23's EOS trick), exact resume, LoRA and export are inherited.
Run it like any built-in method:

    python main.py fit --config examples/beat_greedy.yaml
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lit_rlhf.losses import nll_loss
from lit_rlhf.modules.online import OnlineModule
from lit_rlhf.types import PromptBatch, Rollout


class BeatGreedySFTModule(OnlineModule):
    needs_rollout_logps = False  # the update never reads sampling-time log-probs: no forward pass for them

    def __init__(self, num_generations: int = 4, margin: float = 0.0, **kwargs: Any) -> None:
        # sampling, reward sources, optimiser, schedule, LoRA, export ...; a base setting pinned: SFT
        # on the policy's own distribution (log-probs at 1), whatever the sampling temperature
        super().__init__(logprob_temperature=1.0, **kwargs)
        self.num_generations, self.margin = num_generations, margin  # settings as attributes

    @property
    def repeats(self) -> int:  # responses sampled per prompt
        return self.num_generations

    def check_config(self, trainer: Any, datamodule: Any) -> list[str]:  # refused at start-up, all at once
        problems = super().check_config(trainer, datamodule)
        if self.reward_normalization != "none":  # the base's setting, an attribute too
            problems.append("BeatGreedySFTModule compares raw rewards: reward_normalization must be 'none'")
        return problems

    def rollout_extras(self, batch: PromptBatch, rollout: Rollout) -> dict[str, Tensor]:
        greedy = self.greedy_rollout(batch)  # (B rows) decoded, scored and shaped in the rollout
        return {"greedy_scores": greedy.scores.float().repeat_interleave(self.repeats)}  # (B*G,)

    def update(self, rollout: Rollout) -> tuple[Rollout, dict[str, Tensor]]:
        kept = rollout.scores.float() > rollout.extras["greedy_scores"] + self.margin  # (N,)
        mask = rollout.loss_mask & kept[:, None]  # (N, R) the kept responses' own tokens

        def loss_fn(rows: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            logps = self.response_token_logps(self.policy, rollout.prompt_ids[rows], rollout.prompt_mask[rows],
                                              rollout.response_ids[rows], rollout.response_attention_mask[rows],
                                              self.logprob_temperature)  # (n, R)
            loss = nll_loss(logps, mask[rows])
            return loss, {"policy/loss": loss.detach()}

        # one step on the token mean over the kept responses (the others weigh 0, so every rank
        # runs the same forward and backward passes under DDP)
        stats = self.run_updates(mask.shape[0], 1, 1, loss_fn, row_weights=mask.sum(dim=1).float())
        stats["rewards/kept_fraction"] = kept.float().mean()
        return rollout, stats
