"""Token-mean losses do not depend on how a step's rows are split: SFT under gradient
accumulation, GRPO (`aggregation: token_mean`) and PPO under `micro_batch_size`. The gradient of
the optimizer step is the gradient of the token mean over all the step's rows (fp32, 1e-6)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning import Callback
from torch.utils.data import DataLoader

from lit_rlhf.data.collate import PromptCollator
from lit_rlhf.modules import GRPOModule, PPOModule, SFTModule
from lit_rlhf.rewards import CharacterFractionReward
from lit_rlhf.types import SFTBatch

# completions of very different lengths: a token mean differs from a mean of per-batch means
PAIRS = [("Q: sky?\nA:", " blue"), ("Q: describe a long river in detail?\nA:", " it winds for a very long way past many towns and hills"),
         ("Q: 1+1?\nA:", " 2"), ("Q: grass?\nA:", " green, mostly, in the spring and summer")]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class FirstStepGrads(Callback):
    """The gradients of the first optimizer step, as the optimizer receives them."""

    def __init__(self) -> None:
        self.grads: dict[str, torch.Tensor] | None = None

    def capture(self, pl_module) -> None:
        self.grads = {n: p.grad.detach().clone() for n, p in pl_module.named_parameters() if p.grad is not None}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if not pl_module.automatic_optimization and self.grads is None:  # online: zeroed right after the step
            self.capture(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # automatic optimisation: the module's own on_before_optimizer_step (SFT's token
        # normalisation) runs after the callbacks'; the gradients stay until the next step
        if pl_module.automatic_optimization and self.grads is None and trainer.global_step == 1:
            self.capture(pl_module)


def sft_loader(tokenizer, batch_size):
    rows = []
    for prompt, completion in PAIRS:
        p = tokenizer(prompt)["input_ids"]
        c = tokenizer(completion)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((p + c, [False] * len(p) + [True] * len(c)))

    def collate(items):
        width = max(len(ids) for ids, _ in items)
        ids = torch.full((len(items), width), tokenizer.pad_token_id)
        attn = torch.zeros((len(items), width), dtype=torch.bool)
        loss = torch.zeros((len(items), width), dtype=torch.bool)
        for i, (row, mask) in enumerate(items):
            ids[i, : len(row)] = torch.tensor(row)
            attn[i, : len(row)] = True
            loss[i, : len(row)] = torch.tensor(mask)
        return SFTBatch(ids, attn, loss)

    return DataLoader(rows, batch_size=batch_size, collate_fn=collate)


def trainer(tmp_path, callback, **kwargs):
    return L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                     enable_checkpointing=False, default_root_dir=tmp_path, precision="32", callbacks=[callback], **kwargs)


def sft_grads(tmp_path, batch_size, accumulate):
    module = SFTModule(model="tiny-random-llama", lr=1e-3)
    grads = FirstStepGrads()
    trainer(tmp_path, grads, accumulate_grad_batches=accumulate).fit(module, sft_loader(module.tokenizer, batch_size))
    return grads.grads


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=0, msg=name)


def test_sft_gradient_does_not_depend_on_accumulation(tmp_path):
    whole = sft_grads(tmp_path, batch_size=4, accumulate=1)
    assert_same(whole, sft_grads(tmp_path, batch_size=2, accumulate=2))
    assert_same(whole, sft_grads(tmp_path, batch_size=1, accumulate=4))
    # and it is the gradient of the token mean over the 4 rows
    module = SFTModule(model="tiny-random-llama")
    batch = next(iter(sft_loader(module.tokenizer, 4)))
    module.compute_loss(batch)[0].backward()
    assert_same(whole, {f"policy.{n}": p.grad for n, p in module.policy.named_parameters() if p.grad is not None})


def prompt_loader(tokenizer):
    prompts = ["hello there", "what is", "tell me a story", "once"]
    rows = [{"_prompt_ids": tokenizer(p, add_special_tokens=False)["input_ids"], "prompt": p} for p in prompts]
    return DataLoader(rows, batch_size=4, collate_fn=PromptCollator(tokenizer.pad_token_id))


def early_eos(module) -> None:
    """Make the policy end its responses early at random (an EOS logit bias: the output layer
    gains a bias), so responses have different lengths and a token mean differs from a sequence
    mean. A real layer, not a hook on the logits, so the chunked log-prob path sees it too."""
    head = module.policy.lm_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.zero_()
        biased.bias[module.tokenizer.eos_token_id] = 4.0
    module.policy.lm_head = biased


def online_grads(tmp_path, make, micro_batch_size):
    L.seed_everything(0)
    module = make(micro_batch_size)
    early_eos(module)
    grads = FirstStepGrads()
    trainer(tmp_path, grads).fit(module, prompt_loader(module.tokenizer))
    return grads.grads


def grpo(micro_batch_size):
    return GRPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward("abcdefghijklm")], num_generations=2,
                      max_new_tokens=12, kl_coef=0.04, aggregation="token_mean", micro_batch_size=micro_batch_size,
                      max_grad_norm=None, lr=1e-3)


def ppo(micro_batch_size):
    return PPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward("abcdefghijklm")], max_new_tokens=12,
                     ppo_epochs=1, micro_batch_size=micro_batch_size, max_grad_norm=None, lr=1e-3)


@pytest.mark.parametrize("make", [grpo, ppo], ids=["grpo_token_mean", "ppo"])
def test_online_gradient_does_not_depend_on_micro_batch_size(tmp_path, make):
    whole = online_grads(tmp_path, make, None)
    assert_same(whole, online_grads(tmp_path, make, 1))
    assert_same(whole, online_grads(tmp_path, make, 3))
