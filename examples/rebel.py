"""A second new online method: REBEL, REinforcement learning via regressing relative rewards
(Gao et al. 2024, "REBEL: Reinforcement Learning via Regressing Relative Rewards", Algorithm 1).

Each step samples two responses y, y' per prompt from the current policy pi_t and regresses the
difference of their log-ratios onto the difference of their rewards:

    L(theta) = E_x [ ( (1/eta) * (log pi_theta(y|x)/pi_t(y|x) - log pi_theta(y'|x)/pi_t(y'|x))
                       - (r(x, y) - r(x, y')) )^2 ]

over several passes (`num_iterations`) of `num_minibatches` minibatches, one optimizer step each.
The loss reads a pair at once, so the module sets `whole_groups`: every minibatch and micro-batch
holds whole pairs (a prompt's two rows, side by side) in every pass.

It uses these extension points of `OnlineModule`: `repeats` (two responses per prompt),
`whole_groups` (a pair loss), `updates_per_rollout` (passes x minibatches, which size the schedule
and the episode budget), `needs_rollout_logps` (the default True: pi_t's log-probs are the
rollout's), `update` with `run_updates` (minibatches of whole pairs, exact accumulation, clipping,
the schedule) and settings as init arguments kept as attributes. The rollout source (hf, vLLM,
an asynchronous producer), reward sources, rollout hooks, exact resume, LoRA and export are the
base's. Run it like any built-in method:

    python main.py fit --config examples/rebel.yaml
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import Tensor

from lit_rlhf.modules.online import OnlineModule
from lit_rlhf.ops import masked_sum
from lit_rlhf.types import Rollout


class REBELLossOutput(NamedTuple):
    loss: Tensor  # scalar: the mean squared regression error over the pairs
    predicted: Tensor  # (n,) detached: the predicted reward difference (1/eta) * (log-ratio_y - log-ratio_y')
    target: Tensor  # (n,) detached: r(x, y) - r(x, y')


def rebel_loss(logps: Tensor, old_logps: Tensor, rewards: Tensor, eta: float) -> REBELLossOutput:
    """REBEL's squared regression loss (Gao et al. 2024, Eq. 1 / Algorithm 1, line 4).

    logps, old_logps, rewards: (n, 2), a pair per row: the sequence log-probs under the policy
    being trained and under the sampling policy pi_t, and the two responses' rewards."""
    log_ratios = logps - old_logps  # (n, 2)
    predicted = (log_ratios[:, 0] - log_ratios[:, 1]) / eta  # (n,)
    target = rewards[:, 0] - rewards[:, 1]  # (n,)
    loss = ((predicted - target) ** 2).mean()
    return REBELLossOutput(loss, predicted.detach(), target.detach())


class REBELModule(OnlineModule):
    whole_groups = True  # the loss reads a pair at once: micro-batches hold whole pairs

    def __init__(self, eta: float = 1.0, num_iterations: int = 2, num_minibatches: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # sampling, reward sources, rollout source, optimiser, LoRA, export ...
        if not eta > 0 or num_iterations < 1 or num_minibatches < 1:
            raise ValueError(f"eta must be > 0, num_iterations and num_minibatches >= 1; got {eta}, {num_iterations}, "
                             f"{num_minibatches}")
        self.eta, self.num_iterations, self.num_minibatches = eta, num_iterations, num_minibatches  # attributes

    @property
    def repeats(self) -> int:  # a pair of responses per prompt
        return 2

    def updates_per_rollout(self) -> int:  # passes x minibatches: the schedule and the budget follow
        return self.num_iterations * self.num_minibatches

    def update(self, rollout: Rollout) -> tuple[Rollout, dict[str, Tensor]]:
        mask, attention = rollout.loss_mask, rollout.response_attention_mask  # (2B, R): the policy's tokens, context
        old = masked_sum(rollout.logps, mask, dim=1)  # (2B,) log pi_t(y|x), sampled
        scores = rollout.scores.float()  # (2B,)

        def loss_fn(rows: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            # `rows` are whole pairs in every pass (`whole_groups`): rows 2i and 2i+1 share a prompt
            per_token = self.response_token_logps(self.policy, rollout.prompt_ids[rows], rollout.prompt_mask[rows],
                                                  rollout.response_ids[rows], attention[rows], self.logprob_temperature,
                                                  groups=rows // 2)  # (2n, R)
            logps = masked_sum(per_token, mask[rows], dim=1)  # (2n,)
            out = rebel_loss(logps.view(-1, 2), old[rows].view(-1, 2), scores[rows].view(-1, 2), self.eta)
            return out.loss, {"loss/rebel": out.loss.detach(), "rewards/target_abs": out.target.abs().mean(),
                              "rewards/predicted_abs": out.predicted.abs().mean()}

        stats = self.run_updates(mask.shape[0], self.num_iterations, self.num_minibatches, loss_fn)
        pairs = scores.view(-1, 2)
        stats["rewards/tie_fraction"] = (pairs[:, 0] == pairs[:, 1]).float().mean()
        return rollout, stats

