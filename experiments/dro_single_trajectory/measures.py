"""What the DRO miniature measures of a trained policy and its value, exactly (`exact.py`).

`evaluate`: per held-out prompt, expected and greedy reward, KL to the start and win rates.
`regularised_objective` and `distance_to_optimum`: from a run's saved numbers, the objective
DRO-V optimises and its distance to that objective's optimum pi*, exactly.
`value_fit`: R^2 of DRO-V's V(x) against its exact target. `sample_mean_fit`: the same R^2 for
the per-prompt mean of the training draws, the V a value network that memorised its training
data would give: the scale `value_fit` is read on (with a few draws per prompt, the draws' noise
can exceed the spread of V across prompts, and then even that memorised V scores below 0).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from experiments.dro_single_trajectory import exact
from lit_rlhf.data.collate import pad_right
from lit_rlhf.types import SingleBatch


def r_squared(prediction: torch.Tensor, target: torch.Tensor) -> float | None:
    """1 - MSE(prediction, target) / Var(target); None when the target does not vary."""
    spread = float(target.var(correction=0))
    return 1.0 - float(((prediction.double() - target) ** 2).mean()) / spread if spread > 0 else None


def evaluate(logp: torch.Tensor, start_logp: torch.Tensor, rewards: torch.Tensor) -> dict[str, Any]:
    """Per prompt, exactly: expected and greedy reward, KL to the start, the reward-level masses
    (for win rates) and the win rate against the start."""
    levels = exact.level_masses(logp, rewards)
    return {"expected_reward": exact.expected_reward(logp, rewards).tolist(),
            "greedy_reward": exact.greedy_reward(logp, rewards).tolist(),
            "kl": exact.kl(logp, start_logp).tolist(),
            "levels": levels.tolist(),
            "win_rate_vs_start": exact.win_rate_of_levels(levels, exact.level_masses(start_logp, rewards)).tolist()}


@torch.no_grad()
def value_fit(module, rows: Sequence[dict[str, Any]], logp: torch.Tensor, start_logp: torch.Tensor,
              normalised: torch.Tensor, batch_size: int = 64) -> float | None:
    """R^2 of the module's V(x) on `rows` against its exact target for the trained policy,
    V_pi(x) = E_{y ~ start}[r_norm - tau (log pi - log pi_start)] (the data are the start's
    draws; the minimiser of the DRO loss over V(x) for this pi). None for a module without a
    per-prompt value (not DRO-V, or `batch_estimate`)."""
    if getattr(module, "value_form", None) in (None, "batch_estimate"):
        return None
    target = (start_logp.exp() * (normalised - module.tau * (logp - start_logp))).sum(-1)  # (P,)
    module.eval()
    values = []
    for first in range(0, len(rows), batch_size):
        ids = [list(r["_prompt_ids"]) for r in rows[first:first + batch_size]]
        input_ids, mask = pad_right(ids, module.tokenizer.pad_token_id)
        batch = SingleBatch(input_ids, mask, torch.zeros_like(mask), torch.tensor([len(r) for r in ids]))
        values.append(module.values(batch).double())
    return r_squared(torch.cat(values), target)


def sample_mean_fit(triplets: Sequence[dict[str, Any]], start_logp: torch.Tensor, normalised: torch.Tensor,
                    mean: float, std: float) -> float | None:
    """R^2, on the training prompts, of the per-prompt mean of the normalised rewards of the
    triplets (the least-squares V(x) of a value that memorises its data) against the start's
    exact V(x) = E_start[r_norm]: what `value_fit` on the training prompts is read against."""
    sums = torch.zeros(normalised.shape[0], dtype=torch.float64)
    counts = torch.zeros_like(sums)
    for t in triplets:
        sums[t["prompt_index"]] += (float(t["reward"]) - mean) / std
        counts[t["prompt_index"]] += 1
    if (counts == 0).any():
        raise ValueError(f"{int((counts == 0).sum())} training prompts have no triplet")
    return r_squared(sums / counts, (start_logp.exp() * normalised).sum(-1))


def normalised_expected(run: dict[str, Any], mean: float, std: float) -> torch.Tensor:
    """(P,) E_pi[r_norm] per prompt from a run's saved E_pi[r] (r_norm = (r - mean) / std is linear in r)."""
    return (torch.tensor(run["expected_reward"], dtype=torch.float64) - mean) / std


def regularised_objective(run: dict[str, Any], mean: float, std: float, tau: float) -> list[float]:
    """Per prompt, the objective DRO-V optimises (Richemond et al. 2024, Eq. 2, with the
    normalised rewards it is trained on): J(pi) = E_pi[r_norm] - tau KL(pi || pi_start), from a
    run's saved expected reward and exact KL."""
    return (normalised_expected(run, mean, std) - tau * torch.tensor(run["kl"], dtype=torch.float64)).tolist()


def distance_to_optimum(run: dict[str, Any], log_z: torch.Tensor, mean: float, std: float, tau: float) -> list[float]:
    """Per prompt, KL(pi || pi*) exactly (`exact.kl_to_optimum`), pi* ∝ pi_start exp(r_norm / tau);
    `log_z` (P,) from `exact.log_partition` of the start's level masses and the normalised levels."""
    return exact.kl_to_optimum(normalised_expected(run, mean, std), torch.tensor(run["kl"], dtype=torch.float64),
                               log_z, tau).tolist()
