"""Best-of-N sampling, the evaluation baseline of RLHF (Stiennon et al. 2020; Gao et al. 2023;
Lambert, "RLHF", ch. 10): sample N completions of each prompt from the policy, keep the one a
reward scores highest. It moves log N - (N-1)/N nats away from the policy
(`lit_rlhf.losses.best_of_n_kl`), the budget at which a trained policy can be compared with it.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import torch

from lit_rlhf.evaluation.completions import generate_completions
from lit_rlhf.generation import SamplingConfig
from lit_rlhf.losses.best_of_n import best_of_n_kl, rejection_sampling_mask


class BestOfN(NamedTuple):
    completions: list[str]  # the best of N for each prompt, in order
    rewards: list[float]  # its reward
    mean_reward: float  # the mean reward of all N x prompts samples (the policy's own)
    kl: float  # log N - (N-1)/N, the best-of-N distribution's KL to the policy, in nats


def best_of_n(model: torch.nn.Module, tokenizer: Any, prompts: Sequence[str], prompt_ids: Sequence[Sequence[int]],
              n: int, reward_fn: Callable[..., Sequence[float]], sampling: SamplingConfig, batch_size: int = 8,
              seed: int = 0, engine: Any = None) -> BestOfN:
    """The best of `n` samples (`sampling`, seeded) of each prompt under `reward_fn(prompts,
    completions) -> rewards` (a reward function of `lit_rlhf.rewards`); ties go to the first."""
    if n < 1 or not sampling.do_sample:
        raise ValueError(f"best-of-n needs n >= 1 and sampling (do_sample), got n={n}, do_sample={sampling.do_sample}")
    repeated_ids = [ids for ids in prompt_ids for _ in range(n)]
    repeated = [p for p in prompts for _ in range(n)]
    texts = generate_completions(model, tokenizer, repeated_ids, sampling, batch_size, seed=seed, engine=engine)
    scores = torch.as_tensor(list(reward_fn(repeated, texts)), dtype=torch.float32)  # (P*n,)
    kept = rejection_sampling_mask(scores, n).nonzero().flatten().tolist()
    return BestOfN([texts[i] for i in kept], [float(scores[i]) for i in kept], float(scores.mean()), best_of_n_kl(n))
