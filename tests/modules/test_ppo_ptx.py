"""PPOPtxModule: each optimizer step's gradient is PPO's plus gamma times the gradient of the SFT
rows' token-mean NLL (InstructGPT eq. 2), the SFT batch shared out over micro-batches; gamma 0 is
PPO bitwise; the SFT data is checked at start-up."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lit_rlhf.checks import ConfigError
from lit_rlhf.models import load_causal_lm
from lit_rlhf.modules import PPOModule, PPOPtxModule
from lit_rlhf.rewards import CharacterFractionReward
from tests.learning.tasks import make_prompts, prompt_loader
from tests.modules.test_remax import LETTERS

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SFT = {"class_path": "lit_rlhf.data.TLDRSFTDataModule",
       "init_args": {"path": "bundled:tldr_sft", "batch_size": 3, "max_prompt_length": 96, "max_completion_length": 256,
                     "limit": 6}}
PPO = dict(model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)], max_new_tokens=4, lr=1e-2,
           ppo_epochs=2, num_minibatches=1, micro_batch_size=1, max_grad_norm=None, lr_scheduler="constant",
           log_completions_every_n_steps=0)


class Grads(L.Callback):
    """The policy's gradients (name -> tensor) at each optimizer step, and the step's metrics."""

    def __init__(self):
        self.grads, self.metrics = [], []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.grads.append({n: p.grad.clone() for n, p in pl_module.policy.named_parameters() if p.grad is not None})

    def on_train_batch_end(self, trainer, *args):
        self.metrics.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def fit(module, steps: int):
    grads = Grads()
    L.seed_everything(0)
    L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False, callbacks=[grads],
              enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
              ).fit(module, prompt_loader(module.tokenizer, make_prompts(4, 0), 2))
    return grads


def build(cls=PPOPtxModule, **kwargs):
    L.seed_everything(0)
    return cls(**{**PPO, **kwargs})


def test_step_gradient_is_ppo_plus_gamma_times_the_sft_nll_gradient():
    """The first step of PPO-ptx (gamma 0.5) and of PPO-ptx with gamma 0 see the same rollout;
    their gradients differ by 0.5 x the gradient of the first SFT batch's token-mean NLL, worked
    out here from a plain forward pass of the initial policy. Two rollout rows in micro-batches
    of 1: the 3 SFT rows are shared out 2 + 1."""
    ptx = build(ptx_data=SFT, ptx_coef=0.5, ppo_epochs=1)  # one optimizer step per rollout
    initial = {k: v.clone() for k, v in ptx.policy.state_dict().items()}
    with_ptx = fit(ptx, 1)
    without = fit(build(ptx_data=SFT, ptx_coef=0.0, ppo_epochs=1), 1)

    reference = load_causal_lm("tiny-random-llama", ptx.tokenizer)
    reference.load_state_dict(initial)
    batch = ptx.ptx_stream.batch(0)  # the stream's first batch: what step 1 trained on
    logits = reference(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits[:, :-1].float()
    token = logits.log_softmax(dim=-1).gather(2, batch.input_ids[:, 1:, None]).squeeze(2)  # (B, T-1)
    scored = batch.loss_mask[:, 1:]  # the completion tokens (EOS included)
    nll = -(token * scored).sum() / scored.sum()
    nll.backward()
    nll = float(nll.detach())
    expected = {n: p.grad for n, p in reference.named_parameters()}
    assert with_ptx.metrics[0]["train/loss/ptx"] == pytest.approx(nll, rel=1e-5)
    assert ptx.ptx_batches == 1
    assert max(float(g.abs().max()) for g in expected.values()) > 1e-3  # the term is not vacuous
    for name, grad in with_ptx.grads[0].items():
        torch.testing.assert_close(grad - without.grads[0][name], 0.5 * expected[name], atol=2e-6, rtol=1e-4)


def test_gamma_zero_is_ppo_bitwise():
    """With gamma 0 the SFT rows are read (one batch per optimizer step) and change nothing: the
    same weights as PPOModule's, bit for bit, after a rollout of 2 optimizer steps."""
    ppo = build(PPOModule)
    fit(ppo, 2)
    zero = build(ptx_data=SFT, ptx_coef=0.0)
    fit(zero, 2)
    a, b = ppo.state_dict(), zero.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert zero.ptx_batches == 2


def test_sft_data_that_is_not_sft_rows_is_refused_at_start_up():
    prompts = {"class_path": "lit_rlhf.data.TLDRPromptDataModule", "init_args": {"path": "bundled:tldr_sft"}}
    module = build(ptx_data=prompts)
    with pytest.raises(ConfigError, match="ptx_data: TLDRPromptDataModule yields PromptBatch"):
        fit(module, 1)
    with pytest.raises(ValueError, match="ptx_coef"):
        build(ptx_data=SFT, ptx_coef=-1.0)
