"""ReMaxModule: the greedy baseline is decoded and scored in the rollout (never in the update),
carried as a per-row extra, shaped by the rollout hooks like the samples, and the advantage is
the sample's reward minus it."""

from __future__ import annotations

import dataclasses

import lightning as L
import pytest
import torch

from lit_rlhf.generation import generate_responses
from lit_rlhf.modules import ReMaxModule
from lit_rlhf.rewards import CharacterFractionReward
from tests.learning.tasks import make_prompts, prompt_loader

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
LETTERS = "abcdefghijklmnopqrstuvwxyz"


class Probe(L.Callback):
    """Every rollout the hooks see (greedy baselines: B rows; samples: B*k rows) and the stats."""

    def __init__(self):
        self.shaped, self.ended = [], []

    def on_rollout_scores(self, trainer, pl_module, rollout):
        self.shaped.append(rollout)
        return rollout.with_scores(rollout.scores + 1.0)  # a shaping hook: both must see it

    def on_rollout_end(self, trainer, pl_module, rollout):
        self.ended.append((rollout, {}))

    def on_train_batch_end(self, trainer, *args):  # the step's stats are logged after its rollout ended
        self.ended[-1][1].update({k: float(v) for k, v in trainer.callback_metrics.items()})


def test_greedy_baseline_comes_from_the_rollout_as_an_extra():
    L.seed_everything(0)
    module = ReMaxModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)], num_generations=2,
                         max_new_tokens=6, lr=1e-2, lr_scheduler="constant", log_completions_every_n_steps=0)
    assert module.needs_rollout_logps is False and getattr(module, "ref_model", None) is None  # kl_coef 0
    tok = module.tokenizer
    loader = prompt_loader(tok, make_prompts(4, 0), 2)
    greedy = dataclasses.replace(module.sampling, do_sample=False)
    generated_in_update = []
    source = module.rollout_source  # every response, sampled or greedy, comes from the module's source
    generate, update = source.generate, module.update

    def update_probe(rollout):
        module._updating = True
        try:
            return update(rollout)
        finally:
            module._updating = False

    def generate_probe(*args):
        generated_in_update.append(getattr(module, "_updating", False))
        return generate(*args)

    module.update, source.generate = update_probe, generate_probe
    probe = Probe()
    L.seed_everything(0)
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False, callbacks=[probe],
                        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1)
    initial = {k: v.clone() for k, v in module.policy.state_dict().items()}
    trainer.fit(module, loader)

    assert generated_in_update == [False, False, False, False]  # samples + greedy per rollout, none in update
    assert [r.num_rows for r in probe.shaped] == [2, 4, 2, 4]  # greedy (B), then samples (B*k): both shaped
    rollout, metrics = probe.ended[0]
    greedy_seen = probe.shaped[0]  # what the hook was given: the raw greedy scores
    assert torch.equal(rollout.extras["greedy_scores"], (greedy_seen.scores + 1.0).repeat_interleave(2))
    # the extra is the greedy decode of the initial policy on this step's prompts, shaped (+1)
    fresh = ReMaxModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)], max_new_tokens=6)
    fresh.policy.load_state_dict(initial)
    ids, mask, _ = generate_responses(fresh.policy, greedy_seen.prompt_ids, greedy_seen.prompt_mask, greedy,
                                      tok.eos_token_id, tok.pad_token_id)
    assert torch.equal(ids, greedy_seen.response_ids)
    # the advantage: the sample's shaped reward minus the greedy one (kl_coef 0)
    advantages = rollout.scores - rollout.extras["greedy_scores"]
    assert metrics["train/advantages/mean"] == pytest.approx(float(advantages.mean()), abs=1e-6)
    assert "train/objective/entropy" not in metrics and rollout.logps is None  # no log-probs needed
    assert any(not torch.equal(v, initial[k]) for k, v in module.policy.state_dict().items())


def test_remax_refuses_a_normalised_reward():
    with pytest.raises(ValueError, match="reward_normalization must be 'none'"):
        ReMaxModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)], num_generations=2,
                    reward_normalization="group")
