"""Online methods raise a reward with a known optimum: the expected share of letters among the
sampled tokens (`tests.learning.tasks.LetterReward`, optimum 1), measured exactly from the
policy's logits on held-out prompts before and after 8 rollouts.

PPO, RLOO, ReMax, rejection sampling, online DPO and GRPO with each family option
(group-normalised and leave-one-out advantages, Dr. GRPO, DAPO, GSPO, REINFORCE++ with and
without its group baseline). Thresholds come from
measured runs (`python -m tests.learning.measure`, seeds 0-4) and from the same runs with the
method broken: see tests/learning/README.md.
"""

from __future__ import annotations

import pytest

from tests.learning.runs import ONLINE, run_online

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SEEDS = (0, 1, 2)

# the least gain of the expected reward (it starts at 0.099; 0.045 for DAPO, whose responses
# end early at random) after 8 rollouts (tests/learning/README.md)
MIN_GAIN = {
    "grpo": 0.2,
    "grpo_rloo_advantage": 0.1,
    "dr_grpo": 0.15,
    "dapo": 0.035,
    "gspo": 0.3,
    "reinforce_pp": 0.15,
    "reinforce_pp_baseline": 0.13,
    "rloo": 0.15,
    "ppo": 0.06,
    "remax": 0.03,
    "rejection_sampling": 0.07,
    "online_dpo": 0.08,
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("method", sorted(ONLINE))
def test_online_method_raises_the_expected_reward(method, seed):
    measure = run_online(method, seed)
    print(f"{method} seed {seed}: {measure}")
    assert measure.gain >= MIN_GAIN[method], (method, seed, measure)
