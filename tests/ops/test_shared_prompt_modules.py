"""`shared_prompt` in the modules: DPO, the reward model and GRPO give the same losses, gradients
and trained weights with the shared-prompt layout as with the padded rows (fp32)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lit_rlhf.training.memory import Memory
from lit_rlhf.data.collate import PromptCollator
from lit_rlhf.modules import DPOModule, GRPOModule, RewardModule
from lit_rlhf.models import shared_prompt as sp
from lit_rlhf.rewards import CharacterFractionReward
from tests.modules.test_dpo_module import perturb, preference_batch

ATOL = 1e-5


@pytest.fixture
def shared_calls(monkeypatch):
    """Counts the forwards that really ran on the shared-prompt layout."""
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return build(*args, **kwargs)

    build = sp.build_layout
    monkeypatch.setattr(sp, "build_layout", counting)
    return calls


def grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    module.zero_grad(set_to_none=True)
    return out


def assert_close_dicts(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = ATOL) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=1e-4, msg=name)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_loss_stats_and_gradients_match_the_padded_rows(tiny_tokenizer, loss_type, shared_calls):
    results = []
    for shared in (False, True):
        module = DPOModule(memory=Memory(shared_prompt=shared), loss_type=loss_type, nll_coef=0.5)
        perturb(module.policy, seed=1)  # the policy moves away from its reference
        loss, stats = module.compute_loss(preference_batch(tiny_tokenizer))
        loss.backward()
        results.append((loss.detach(), stats, grads(module.policy)))
    assert len(shared_calls) == 2  # policy and reference, shared run only
    (loss_a, stats_a, grads_a), (loss_b, stats_b, grads_b) = results
    assert stats_a["rewards/margins"].abs() > 1e-4  # the pairs really differ
    torch.testing.assert_close(loss_b, loss_a, atol=ATOL, rtol=0)
    assert_close_dicts(stats_b, stats_a)
    assert_close_dicts(grads_b, grads_a)


def test_reward_module_loss_and_gradients_match_the_padded_rows(tiny_tokenizer, shared_calls):
    results = []
    for shared in (False, True):
        torch.manual_seed(0)  # the same fresh head
        module = RewardModule(memory=Memory(shared_prompt=shared), center_coef=0.1)
        out, chosen, rejected = module._loss(preference_batch(tiny_tokenizer))
        out.loss.backward()
        results.append((out.loss.detach(), chosen.detach(), rejected.detach(), grads(module.reward_model)))
        assert len(shared_calls) == int(shared)
    for a, b in zip(*(r[:3] for r in results)):
        torch.testing.assert_close(b, a, atol=ATOL, rtol=0)
    assert_close_dicts(results[1][3], results[0][3])


PROMPTS = ["hello there", "what is", "tell me a story", "x", "abc", "The cat", "Q: 2+2?", "once"]


def grpo_weights(shared: bool, tmp_path) -> dict[str, torch.Tensor]:
    """Two rollouts of 4 prompts x G = 4, two passes over two minibatches, micro-batches of 3 rows
    (groups split across micro-batches), the reference in the loss and a reward model-free reward."""
    L.seed_everything(0)
    module = GRPOModule(
        model="tiny-random-llama", reward_fns=[CharacterFractionReward("abcdefghijklmnopqrstuvwxyz")],
        num_generations=4, max_new_tokens=6, lr=1e-3, lr_scheduler="constant", kl_coef=0.05, num_iterations=2,
        num_minibatches=2, micro_batch_size=3, total_episodes=32, memory=Memory(shared_prompt=shared),
    )
    rows = [{"_prompt_ids": module.tokenizer(p, add_special_tokens=False)["input_ids"], "prompt": p} for p in PROMPTS]
    loader = DataLoader(rows, batch_size=4, shuffle=True, collate_fn=PromptCollator(module.tokenizer.pad_token_id))
    trainer = L.Trainer(max_epochs=-1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, loader)
    assert trainer.global_step == 8  # 2 rollouts x 2 iterations x 2 minibatches
    return {n: p.detach().clone() for n, p in module.policy.named_parameters()}


def test_grpo_training_with_split_groups_matches_the_padded_rows(tmp_path, shared_calls):
    padded = grpo_weights(False, tmp_path / "a")
    assert not shared_calls
    shared = grpo_weights(True, tmp_path / "b")
    assert shared_calls  # rollout scoring (reference) and the updates' micro-batches holding 2+ rows of a group
    initial = GRPOModule(model="tiny-random-llama", reward_fns=[len], kl_coef=0.0).policy.state_dict()
    assert any(not torch.equal(padded[n], initial[n]) for n in padded)  # the policy trained
    assert_close_dicts(shared, padded, atol=1e-5)
