"""Gradient checkpointing is in effect during fit, for models loaded from a directory too.

`from_pretrained` returns a model in eval mode and Lightning's fit does not switch it, while
Hugging Face decoder layers checkpoint only in train mode: a module must put its trained models
in train mode itself, or `gradient_checkpointing: true` silently keeps every activation. The
evidence asserted here is the recomputation itself: with checkpointing on, each decoder layer of
the trained model runs once more inside the backward pass (and never without it), while frozen
models stay in eval mode. Lightning's start-of-training check of the modes (which runs before
`on_train_start`) reports nothing: the frozen models are in eval mode on purpose."""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader
from transformers.modeling_layers import GradientCheckpointingLayer

from lit_rlhf.training.memory import Memory
from lit_rlhf.data.collate import PromptCollator
from lit_rlhf.models import load_causal_lm, load_tokenizer
from lit_rlhf.modules import DPOModule, DROVModule, KTOModule, PPOModule, RewardModule, SFTModule
from lit_rlhf.rewards import CharacterFractionReward
from lit_rlhf.types import PreferenceBatch, SFTBatch, SingleBatch

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT, CHOSEN, REJECTED = [5, 6, 7, 8, 9, 10], [11, 12, 13, 2], [14, 15, 2, 2]


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory) -> str:
    """The tiny model saved to a directory: loading it goes through `from_pretrained` (eval mode)."""
    path = tmp_path_factory.mktemp("tiny_model")
    tokenizer = load_tokenizer("tiny-random-llama")
    load_causal_lm("tiny-random-llama", tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    assert not load_causal_lm(str(path), tokenizer).training  # the situation under test
    return str(path)


class Recomputations(L.Callback):
    """Counts the calls of the decoder layers of the trained models `trained_of(module)`
    inside the backward pass (between `on_before_backward` and `on_after_backward`) and records,
    at the start of each training batch, whether every trained submodule is in train mode and
    every frozen one (`frozen_of(module)`) in eval mode."""

    def __init__(self, trained_of, frozen_of=lambda module: []) -> None:
        self.trained_of, self.frozen_of = trained_of, frozen_of
        self.in_backward = False
        self.backward_calls: list[int] = []
        self.modes: list[tuple[bool, bool]] = []

    def on_fit_start(self, trainer, pl_module) -> None:
        layers = [m for model in self.trained_of(pl_module) for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
        assert layers, "no decoder layers found"
        self.layers = len(layers)
        for layer in layers:  # a pre-hook: the recomputation may stop early, inside the layer
            layer.register_forward_pre_hook(self._count)

    def _count(self, module, args) -> None:
        if self.in_backward:
            self.backward_calls[-1] += 1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        trained = all(m.training for model in self.trained_of(pl_module) for m in model.modules())
        frozen = not any(m.training for f in self.frozen_of(pl_module) for m in f.modules())
        self.modes.append((trained, frozen))

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self.backward_calls.append(0)
        self.in_backward = True

    def on_after_backward(self, trainer, pl_module) -> None:
        self.in_backward = False


def fit_one_step(module, batch_or_loader, callback: Recomputations, tmp_path) -> None:
    """One training step; Lightning's start-of-training check finds no module in eval mode but
    the frozen ones, which it does not report."""
    trainer = L.Trainer(max_steps=1, max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, callbacks=[callback],
                        default_root_dir=tmp_path)
    loader = batch_or_loader
    if not isinstance(loader, DataLoader):
        loader = DataLoader([batch_or_loader], batch_size=None, collate_fn=lambda item: item)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, train_dataloaders=loader)
    assert not [str(w.message) for w in caught if "eval mode" in str(w.message)]


def sft_batch() -> SFTBatch:
    ids = torch.tensor([PROMPT + CHOSEN, PROMPT + REJECTED])
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    loss_mask[:, len(PROMPT):] = True
    return SFTBatch(ids, torch.ones_like(ids, dtype=torch.bool), loss_mask)


def preference_batch() -> PreferenceBatch:
    ids = torch.tensor([PROMPT + CHOSEN, PROMPT + REJECTED])  # one pair: chosen row, then rejected
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    loss_mask[:, len(PROMPT):] = True
    return PreferenceBatch(ids, torch.ones_like(ids, dtype=torch.bool), loss_mask, torch.full((2,), len(PROMPT)),
                           meta={"index": [0, 0]})


def prompt_loader(tokenizer) -> DataLoader:
    rows = [{"_prompt_ids": tokenizer(p, add_special_tokens=False)["input_ids"], "prompt": p} for p in ("hello there", "once")]
    return DataLoader(rows, batch_size=2, collate_fn=PromptCollator(tokenizer.pad_token_id))


def single_batch() -> SingleBatch:
    ids = torch.tensor([PROMPT + CHOSEN, PROMPT + REJECTED])
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    loss_mask[:, len(PROMPT):] = True
    return SingleBatch(ids, torch.ones_like(ids, dtype=torch.bool), loss_mask, torch.full((2,), len(PROMPT)),
                       rewards=torch.tensor([1.0, -1.0]))


@pytest.mark.parametrize("checkpointing", [True, False])
def test_sft_recomputes_every_layer_in_backward_only_with_checkpointing(saved_tiny, tmp_path, checkpointing):
    module = SFTModule(model=saved_tiny, memory=Memory(gradient_checkpointing=checkpointing))
    calls = Recomputations(lambda m: [m.policy])
    fit_one_step(module, sft_batch(), calls, tmp_path)
    assert calls.modes == [(True, True)]
    assert calls.backward_calls == [calls.layers if checkpointing else 0]


def test_dpo_recomputes_the_policy_and_keeps_the_reference_in_eval_mode(saved_tiny, tmp_path):
    module = DPOModule(model=saved_tiny, memory=Memory(gradient_checkpointing=True))
    calls = Recomputations(lambda m: [m.policy], frozen_of=lambda m: [m.ref_model])
    fit_one_step(module, preference_batch(), calls, tmp_path)
    assert calls.modes == [(True, True)]
    assert calls.backward_calls == [calls.layers]  # one policy forward (the pair shares its prompt), recomputed once


@pytest.mark.parametrize("lora", [None, {"r": 4, "alpha": 8}])
def test_reward_model_recomputes_every_layer_in_backward(saved_tiny, tmp_path, lora):
    module = RewardModule(model=saved_tiny, lora=lora, memory=Memory(gradient_checkpointing=True))
    calls = Recomputations(lambda m: [m.reward_model])
    fit_one_step(module, preference_batch(), calls, tmp_path)
    assert calls.modes == [(True, True)]
    assert calls.backward_calls == [calls.layers]


def test_ppo_recomputes_the_policy_and_the_value_model(saved_tiny, tmp_path):
    module = PPOModule(model=saved_tiny, reward_fns=[CharacterFractionReward()], max_new_tokens=4, ppo_epochs=1,
                       num_minibatches=1, total_episodes=2, memory=Memory(gradient_checkpointing=True))
    calls = Recomputations(lambda m: [m.policy, m.value_model], frozen_of=lambda m: [m.ref_model])
    fit_one_step(module, prompt_loader(module.tokenizer), calls, tmp_path)
    assert calls.modes == [(True, True)]
    # the policy term's backward pass, then the value term's (run_updates' loss parts): each model recomputed once
    assert calls.backward_calls == [calls.layers // 2, calls.layers // 2]


@pytest.mark.parametrize("checkpointing", [True, False])
def test_drov_recomputes_the_policy_and_the_value_network(saved_tiny, tmp_path, checkpointing):
    module = DROVModule(model=saved_tiny, memory=Memory(gradient_checkpointing=checkpointing))  # V(x): a separate network
    calls = Recomputations(lambda m: [m.policy, m.value], frozen_of=lambda m: [m.ref_model])
    fit_one_step(module, single_batch(), calls, tmp_path)
    assert calls.modes == [(True, True)]
    assert calls.backward_calls == [calls.layers if checkpointing else 0]  # one backward of policy + value loss


def test_drov_lora_value_on_its_own_base_is_recomputed(saved_tiny, tmp_path):
    # another checkpoint than the policy's: V(x) is a value adapter on its own frozen body
    module = DROVModule(model=saved_tiny, value_model="tiny-random-llama", lora={"r": 4, "alpha": 8},
                        memory=Memory(gradient_checkpointing=True))
    assert module.value.backbone is not module.policy.get_base_model().model  # two bodies
    calls = Recomputations(lambda m: [m.policy, m.value])
    fit_one_step(module, single_batch(), calls, tmp_path)
    assert calls.modes == [(True, True)]
    assert calls.backward_calls == [calls.layers]


def test_kto_recomputes_the_policy_and_keeps_the_reference_in_eval_mode(saved_tiny, tmp_path):
    module = KTOModule(model=saved_tiny, memory=Memory(gradient_checkpointing=True))
    batch = single_batch()._replace(rewards=None, labels=torch.tensor([True, False]))
    calls = Recomputations(lambda m: [m.policy], frozen_of=lambda m: [m.ref_model])
    fit_one_step(module, batch, calls, tmp_path)
    assert calls.modes == [(True, True)]
    assert calls.backward_calls == [calls.layers]  # z0's forward (mismatched pairs) is without grad: not recomputed


def test_a_trained_module_left_in_eval_mode_is_still_reported(tmp_path):
    module = DPOModule(model="tiny-random-llama")
    module.train()
    module.policy.lm_head.eval()  # a trained module in eval mode; the reference is frozen (eval mode on purpose)
    with pytest.warns(UserWarning, match=r"^1 trained module\(s\) in eval mode at the start of training: policy.lm_head$"):
        module.warn_trained_in_eval_mode()
    module.train()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module.warn_trained_in_eval_mode()  # only the frozen reference is in eval mode: nothing to say
    assert not module.ref_model.training


def test_ppo_lora_value_on_a_separate_reward_model_is_recomputed(saved_tiny, tmp_path):
    # a full reward model (not an adapter of the policy's base): the value (D22) is a LoRA adapter on its own body
    reward_dir = RewardModule(model=saved_tiny).export_hf(tmp_path / "reward")
    module = PPOModule(model=saved_tiny, reward_model=str(reward_dir), lora={"r": 4, "alpha": 8}, max_new_tokens=4,
                       ppo_epochs=1, num_minibatches=1, total_episodes=2, memory=Memory(gradient_checkpointing=True))
    assert module.value_model.backbone is not module.policy.get_base_model().model  # two bodies
    calls = Recomputations(lambda m: [m.policy, m.value_model], frozen_of=lambda m: [m.reward_model])
    fit_one_step(module, prompt_loader(module.tokenizer), calls, tmp_path)
    assert calls.modes == [(True, True)]
    assert calls.backward_calls == [calls.layers // 2, calls.layers // 2]  # policy term, then value term

