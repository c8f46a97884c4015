"""RejectionSamplingModule: no log-probs at rollout time, the best sample of each prompt (or the
top k overall) kept, and the update is the NLL of exactly those."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lit_rlhf.losses import nll_loss, rejection_sampling_mask
from lit_rlhf.modules import RejectionSamplingModule
from lit_rlhf.rewards import CharacterFractionReward
from tests.learning.tasks import make_prompts, prompt_loader
from tests.modules.test_remax import LETTERS

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class Ended(L.Callback):
    """Each step's final rollout and the stats logged for it: (rollout, metrics) pairs."""

    def __init__(self):
        self.rollouts = []

    def on_rollout_end(self, trainer, pl_module, rollout):
        self.rollouts.append((rollout, {}))

    def on_train_batch_end(self, trainer, *args):  # the step's stats are logged after its rollout ended
        self.rollouts[-1][1].update({k: float(v) for k, v in trainer.callback_metrics.items()})


@pytest.mark.parametrize("selection, top_k", [("per_prompt", None), ("top_k", 3)])
def test_the_update_is_the_nll_of_the_kept_samples(selection, top_k):
    L.seed_everything(0)
    module = RejectionSamplingModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)],
                                     num_generations=3, selection=selection, top_k=top_k, max_new_tokens=6,
                                     temperature=0.8, lr=1e-2, lr_scheduler="constant", log_completions_every_n_steps=0)
    initial = {k: v.clone() for k, v in module.policy.state_dict().items()}
    calls = []
    logps = module.response_token_logps
    module.response_token_logps = lambda *a, **k: calls.append(a[1].shape[0]) or logps(*a, **k)
    ended = Ended()
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False, callbacks=[ended],
                        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1)
    trainer.fit(module, prompt_loader(module.tokenizer, make_prompts(2, 0), 2))
    rollout, metrics = ended.rollouts[0]
    kept = rejection_sampling_mask(rollout.scores, 3, selection, top_k)
    assert rollout.logps is None and "train/objective/entropy" not in metrics
    assert calls == [int(kept.sum())]  # one forward pass, over the kept rows only
    assert metrics["train/rewards/kept"] == pytest.approx(float(rollout.scores[kept].mean()))
    # the logged loss is the NLL (temperature 1) of the kept rows under the initial policy
    fresh = RejectionSamplingModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)],
                                    num_generations=3)
    fresh.policy.load_state_dict(initial)
    with torch.no_grad():
        expected = nll_loss(fresh.response_token_logps(fresh.policy, rollout.prompt_ids[kept], rollout.prompt_mask[kept],
                                                       rollout.response_ids[kept], rollout.response_attention_mask[kept], 1.0),
                            rollout.response_attention_mask[kept])
    assert metrics["train/policy/loss"] == pytest.approx(float(expected), rel=1e-5)


def test_settings_are_checked():
    args = dict(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)])
    with pytest.raises(ValueError, match="top_k"):
        RejectionSamplingModule(selection="top_k", **args)
    with pytest.raises(ValueError, match=">= 2"):
        RejectionSamplingModule(num_generations=1, **args)
    module = RejectionSamplingModule(num_generations=2, num_minibatches=2, **args)
    dm = type("DM", (), {"batch_size": 3})()
    assert any("updates on 3 rows of each rollout" in p for p in module.check_config(None, dm))
    assert not module.check_config(None, type("DM", (), {"batch_size": 4})())
