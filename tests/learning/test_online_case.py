"""The group methods learn a reward that depends on the prompt (`tests.learning.case_task`).

After a lowercase prompt the wanted tokens are the lowercase letters, after an uppercase prompt
the uppercase ones; a policy that ignores the prompt gains nothing, and each prompt carries a
reward offset that only a baseline from the prompt's own responses cancels. So a method whose
groups, pairs or selections mix prompts (a prompt's copies laid out across the rollout, the
reward reading another row's prompt, advantages computed on a strided reward vector) does not
learn it, where `LetterReward`, which ignores the prompt, let such a break pass.

GRPO and Dr. GRPO (GRPO's advantages, group and no scale), RLOO, REINFORCE++ with its group
baseline, online DPO (a prompt's pair) and rejection sampling (the best of a prompt's 8), each
over 16 rollouts. Thresholds come from measured runs (`python -m tests.learning.measure ...
--task case --rollouts 16`, seeds 0-4) and from the same runs with the layout broken: see
tests/learning/README.md.
"""

from __future__ import annotations

import pytest

from tests.learning.runs_online import run_online

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SEEDS = (0, 1, 2)
ROLLOUTS = 16

# the least gain of the expected CaseReward without its offset (it starts at -0.0005)
MIN_GAIN = {
    "grpo": 0.12,
    "dr_grpo": 0.2,
    "rloo": 0.12,
    "reinforce_pp_baseline": 0.07,
    "online_dpo": 0.05,
    "rejection_sampling": 0.07,
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("method", sorted(MIN_GAIN))
def test_group_method_learns_a_prompt_dependent_reward(method, seed):
    measure = run_online(method, seed, task="case", rollouts=ROLLOUTS)
    print(f"{method} case seed {seed}: {measure}")
    assert measure.gain >= MIN_GAIN[method], (method, seed, measure)
