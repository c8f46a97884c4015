"""Each online method's rollout lays out a prompt's copies where its advantage reads them.

The rollout source gives `repeats` responses per prompt, a prompt's copies contiguous (rows
g*k .. g*k+k-1 for prompt g of the batch), and every group method reads its groups, pairs or
greedy baselines from that layout. A reward that depends only on the prompt (a different value
for each prompt, known by construction) then leaves every method nothing to learn: all its
advantages are exactly 0, best-of-N keeps a response of the same reward as the mean, online DPO
finds only ties. If a group held copies of different prompts (a prompt laid out with `repeat`
instead of `repeat_interleave`, advantages computed on a strided reward vector, a baseline
paired with another prompt's row) the prompts' different rewards would show up as advantages.

A callback on `on_rollout_scores` checks the layout itself: the rows of a group share the prompt
tokens and the prompt text the reward function reads, in the batch's order, and their scores are
the known ones.
"""

from __future__ import annotations

import lightning as L
import pytest

from lit_rlhf.modules import (
    DAPOModule,
    DrGRPOModule,
    GRPOModule,
    GSPOModule,
    OnlineDPOModule,
    PPOModule,
    ReinforcePPModule,
    RejectionSamplingModule,
    ReMaxModule,
    RLOOModule,
)
from tests.learning.tasks import prompt_loader
from tests.modules.pinned import LeaveOneOutGRPO

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PROMPTS = ["the cat?", "a big red house:", "tell me about the old river?"]  # different lengths: padding differs
REWARD = {p: 10.0 * (i + 1) for i, p in enumerate(PROMPTS)}  # one reward per prompt, whatever the response


def prompt_reward(prompts, completions, **columns):
    return [REWARD[p] for p in prompts]


# (class, arguments, the stat (name, value) that says the advantages are exactly what a
# prompt-only reward gives); kl_coef 0 where the method has one, so the score is the reward
GROUP = dict(num_generations=4, kl_coef=0.0)
METHODS = {
    "grpo": (GRPOModule, GROUP, ("advantages/abs_mean", 0.0)),
    "grpo_rloo_advantage": (LeaveOneOutGRPO, GROUP, ("advantages/abs_mean", 0.0)),
    "dr_grpo": (DrGRPOModule, GROUP, ("advantages/abs_mean", 0.0)),
    "dapo": (DAPOModule, dict(GROUP, dynamic_sampling=False), ("advantages/abs_mean", 0.0)),
    "gspo": (GSPOModule, GROUP, ("advantages/abs_mean", 0.0)),
    "reinforce_pp_baseline": (ReinforcePPModule, dict(GROUP, baseline=True), ("advantages/abs_mean", 0.0)),
    "rloo": (RLOOModule, GROUP, ("advantages/abs_mean", 0.0)),
    # two samples per prompt share the prompt's greedy baseline (of the same reward)
    "remax": (ReMaxModule, dict(num_generations=2, kl_coef=0.0), ("advantages/abs_mean", 0.0)),
    # the best of 4 per prompt: every response of a prompt ties, so the kept mean is the mean
    "rejection_sampling": (RejectionSamplingModule, dict(num_generations=4), ("rewards/kept_gain", 0.0)),
    # a prompt's 2 samples form its pair: every pair ties, none is trained on
    "online_dpo": (OnlineDPOModule, dict(), ("pairs/tie_fraction", 1.0)),
    "ppo": (PPOModule, dict(kl_coef=0.0), None),  # one response per prompt: the layout only
}


class LayoutProbe(L.Callback):
    """Checks every rollout's layout against the batch it was sampled for."""

    def __init__(self) -> None:
        self.batch_prompts: list[str] = []
        self.checked: list[int] = []  # rows per checked rollout
        self.metrics: dict[str, float] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batch_prompts = list(batch.meta["prompt"])

    def on_rollout_scores(self, trainer, pl_module, rollout):
        b = len(self.batch_prompts)
        k = rollout.num_rows // b  # ReMax's greedy rollout: 1 row per prompt
        assert rollout.num_rows == b * k and k in (1, pl_module.repeats), (rollout.num_rows, b, pl_module.repeats)
        tokenizer = pl_module.tokenizer
        for row in range(rollout.num_rows):
            prompt = self.batch_prompts[row // k]  # prompt g's copies are rows g*k .. g*k+k-1
            ids = rollout.prompt_ids[row][rollout.prompt_mask[row]].tolist()
            assert tokenizer.decode(ids) == prompt, (row, tokenizer.decode(ids), prompt)
            assert rollout.meta["prompt"][row] == prompt, (row, rollout.meta["prompt"][row], prompt)
            assert float(rollout.scores[row]) == REWARD[prompt], (row, float(rollout.scores[row]), prompt)
        self.checked.append(rollout.num_rows)
        return rollout

    def on_train_batch_end(self, trainer, *args):
        self.metrics.update({k: float(v) for k, v in trainer.callback_metrics.items()})


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_prompts_copies_are_where_the_advantage_reads_them(method):
    cls, kwargs, (stat, value) = METHODS[method][0], METHODS[method][1], METHODS[method][2] or (None, None)
    L.seed_everything(0, verbose=False)
    module = cls(model="tiny-random-llama", reward_fns=[prompt_reward], max_new_tokens=4, temperature=1.0, lr=1e-3,
                 lr_scheduler="constant", log_completions_every_n_steps=0, **kwargs)
    probe = LayoutProbe()
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False, callbacks=[probe],
                        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1)
    trainer.fit(module, prompt_loader(module.tokenizer, PROMPTS, len(PROMPTS)))
    rows = len(PROMPTS) * module.repeats
    assert rows in probe.checked, (probe.checked, rows)  # the sampled rollout was seen
    if stat is not None:
        assert probe.metrics[f"train/{stat}"] == pytest.approx(value, abs=1e-6), (method, probe.metrics)

