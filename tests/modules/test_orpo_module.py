"""ORPOModule: the loss of `orpo_loss` on the per-token mean log-probs of a plain forward pass, no
reference model (with or without LoRA), and a few steps that lower the loss."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.losses import orpo_loss
from lit_rlhf.modules import ORPOModule
from lit_rlhf.types import split_pair
from tests.learning.tasks import sequence_logps
from tests.modules.test_dpo_module import perturb, preference_batch


def test_loss_is_orpo_on_per_token_mean_logps(tiny_tokenizer):
    module = ORPOModule(odds_ratio_coef=0.5)
    perturb(module.policy, seed=1)
    batch = preference_batch(tiny_tokenizer)
    loss, stats = module.compute_loss(batch)
    # independent: a plain forward pass, sums over the completion tokens (EOS included) / their number
    sums = sequence_logps(module.policy, batch.input_ids, batch.attention_mask, batch.loss_mask)  # (2B,)
    means = sums / batch.loss_mask.sum(dim=1)
    chosen, rejected = split_pair(means)
    expected = orpo_loss(chosen, rejected, 0.5)
    torch.testing.assert_close(loss, expected.loss, atol=1e-5, rtol=0)
    torch.testing.assert_close(stats["loss/nll"], -chosen.mean(), atol=1e-5, rtol=0)
    torch.testing.assert_close(stats["rewards/log_odds_ratio"], expected.log_odds_ratios.mean(), atol=1e-5, rtol=0)
    assert stats["loss/odds_ratio"] > 0 and not any(v.requires_grad for v in stats.values())


@pytest.mark.parametrize("lora", [None, {"r": 4, "alpha": 8}])
def test_no_reference_model_is_loaded(lora):
    module = ORPOModule(lora=lora)
    assert not hasattr(module, "ref_model") and module._frozen_names == []
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    if lora is None:
        assert trainable == {f"policy.{n}" for n, _ in module.policy.named_parameters()}
    else:  # the adapter alone trains, on a frozen base
        assert trainable and all("lora_" in n for n in trainable)


def test_bad_input_is_named(tiny_tokenizer):
    with pytest.raises(ValueError, match="odds_ratio_coef"):
        ORPOModule(odds_ratio_coef=-1.0)


def test_a_few_steps_lower_the_loss_and_separate_the_pairs(tiny_tokenizer):
    torch.manual_seed(0)
    module = ORPOModule(odds_ratio_coef=1.0)
    batch = preference_batch(tiny_tokenizer)
    optimizer = torch.optim.AdamW(module.optimizer_param_groups(), lr=3e-3)
    losses, ratios = [], []
    for _ in range(6):
        loss, stats = module.compute_loss(batch)
        losses.append(loss.item())
        ratios.append(stats["rewards/log_odds_ratio"].item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert losses[-1] < losses[0] - 0.05, losses
    assert ratios[-1] > ratios[0], ratios
