"""DPOModule: one concatenated forward, live vs precomputed reference, NLL term, optimisation."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.training.memory import Memory
from lit_rlhf.modules.dpo import DPOModule, sequence_keys
from lit_rlhf.ops import masked_mean
from lit_rlhf.types import PreferenceBatch, SingleBatch

PROMPTS = ["Q: 1+1?\nA:", "Say hi.", "Name a colour:"]
CHOSEN = [" 2", " hi there", " red"]
REJECTED = [" 11 or so", " no", " a colour"]


def right_pad(rows: list[list[int]], masks: list[list[bool]], pad_id: int, extra: int = 0):
    length = max(map(len, rows)) + extra
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    keep = torch.zeros(len(rows), length, dtype=torch.bool)
    scored = torch.zeros_like(keep)
    for i, (row, mask) in enumerate(zip(rows, masks)):
        ids[i, : len(row)] = torch.tensor(row)
        keep[i, : len(row)] = True
        scored[i, : len(row)] = torch.tensor(mask)
    return ids, keep, scored


def preference_batch(tokenizer, prompts=PROMPTS, chosen=CHOSEN, rejected=REJECTED, extra_pad: int = 0) -> PreferenceBatch:
    rows, masks, prompt_lengths = [], [], []
    for completions in (chosen, rejected):
        for prompt, completion in zip(prompts, completions):
            p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            rows.append(p + c)
            masks.append([False] * len(p) + [True] * len(c))
            prompt_lengths.append(len(p))
    ids, keep, scored = right_pad(rows, masks, tokenizer.pad_token_id, extra_pad)
    return PreferenceBatch(ids, keep, scored, torch.tensor(prompt_lengths))


def perturb(module: torch.nn.Module, seed: int = 0, scale: float = 0.05) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)


def test_sequence_keys_ignore_padding_and_order_but_not_content(tiny_tokenizer):
    batch = preference_batch(tiny_tokenizer)
    padded = preference_batch(tiny_tokenizer, extra_pad=5)
    keys = sequence_keys(batch.input_ids, batch.attention_mask, batch.loss_mask)
    assert keys == sequence_keys(padded.input_ids, padded.attention_mask, padded.loss_mask)
    assert len(set(keys)) == 6
    flipped = sequence_keys(batch.input_ids.flip(0), batch.attention_mask.flip(0), batch.loss_mask.flip(0))
    assert flipped == keys[::-1]
    # the same tokens with another prompt/completion split score differently: another key
    moved = batch.loss_mask.clone()
    moved[0, batch.prompt_lengths[0] - 1] = True
    assert sequence_keys(batch.input_ids, batch.attention_mask, moved)[0] != keys[0]


def test_precomputed_reference_gives_the_live_losses(tiny_tokenizer):
    live = DPOModule(beta=0.1)
    pre = DPOModule(beta=0.1, precompute_ref_logps=True)
    assert not hasattr(pre, "ref_model")  # no reference kept in precompute mode
    batch = preference_batch(tiny_tokenizer)
    # precompute over a loader whose batches are padded differently from the training batch
    assert pre.precompute_reference([[preference_batch(tiny_tokenizer, extra_pad=3)]]) == 6
    assert not hasattr(pre, "ref_model")  # freed again
    table = dict(pre.ref_logps_cache)
    # move both policies away from the reference identically, so the log-ratios are not 0
    perturb(live.policy)
    perturb(pre.policy)
    # a resumed run (trained policy) rebuilds the same table: the reference comes from its name
    pre.ref_logps_cache.clear()
    pre.precompute_reference([[batch]])
    assert pre.ref_logps_cache.keys() == table.keys()
    for key, value in table.items():
        assert abs(pre.ref_logps_cache[key] - value) < 1e-5
    loss_live, stats_live = live.compute_loss(batch)
    loss_pre, stats_pre = pre.compute_loss(batch)
    assert stats_live["rewards/margins"].abs() > 1e-3  # the reference matters in this comparison
    torch.testing.assert_close(loss_pre, loss_live, atol=1e-5, rtol=0)
    for name in stats_live:
        torch.testing.assert_close(stats_pre[name], stats_live[name], atol=1e-5, rtol=0)


def test_precompute_reference_respects_ref_model_and_reports_missing_rows(tiny_tokenizer, tmp_path):
    pre = DPOModule(precompute_ref_logps=True)
    batch = preference_batch(tiny_tokenizer)
    with pytest.raises(KeyError, match="no precomputed reference log-probs for rows \\[0, 1, 2, 3, 4, 5\\]"):
        pre.compute_loss(batch)
    # a reference that is not the initial policy: the exported perturbed policy
    other = DPOModule()
    perturb(other.policy, seed=3)
    other.export_hf(tmp_path / "ref")
    pre_other = DPOModule(precompute_ref_logps=True, ref_model=str(tmp_path / "ref"))
    pre.precompute_reference([[batch]])
    pre_other.precompute_reference([[batch]])
    _, stats = pre.compute_loss(batch)
    _, stats_other = pre_other.compute_loss(batch)
    # same policy, different reference -> different implicit rewards
    assert not torch.allclose(stats["rewards/chosen"], stats_other["rewards/chosen"], atol=1e-4)
    assert stats["rewards/chosen"].abs() < 1e-5  # policy == its own initial checkpoint


@pytest.mark.parametrize("shared_prompt", [True, False])
def test_one_concatenated_forward(tiny_tokenizer, shared_prompt):
    module = DPOModule(memory=Memory(shared_prompt=shared_prompt))
    calls = []
    # the decoder: the chunked log-prob path runs it and the output layer, not the model's forward
    module.policy.get_decoder().register_forward_hook(lambda mod, args, kwargs, out: calls.append(kwargs["input_ids"].shape), with_kwargs=True)
    batch = preference_batch(tiny_tokenizer)
    module.compute_loss(batch)  # the first call also checks the chunked path on a few tokens, once per model
    calls.clear()
    module.compute_loss(batch)
    if shared_prompt:  # one packed row [prompt, chosen, rejected] per pair, (B, L)
        chosen, rejected = batch.loss_mask.sum(dim=1).view(2, -1)
        width = int((batch.prompt_lengths[: batch.num_pairs] + chosen + rejected).max())
        assert calls == [torch.Size([batch.num_pairs, width])]
    else:
        assert calls == [batch.input_ids.shape]  # chosen and rejected together, (2B, T)


def test_nll_term_adds_the_chosen_token_mean_nll(tiny_tokenizer):
    plain, with_nll = DPOModule(), DPOModule(nll_coef=0.5)
    batch = preference_batch(tiny_tokenizer)
    loss, _ = plain.compute_loss(batch)
    loss_nll, stats = with_nll.compute_loss(batch)
    per_token = plain.policy_logps(batch.input_ids, batch.attention_mask, batch.loss_mask)[:3]
    nll = -masked_mean(per_token, batch.loss_mask[:3])
    torch.testing.assert_close(stats["loss/nll"], nll.detach())
    torch.testing.assert_close(loss_nll, loss + 0.5 * nll, atol=1e-6, rtol=0)


def test_bad_input_is_named(tiny_tokenizer):
    with pytest.raises(ValueError, match="loss_type"):
        DPOModule(loss_type="kto")
    with pytest.raises(ValueError, match="beta"):
        DPOModule(beta=0.0)
    batch = preference_batch(tiny_tokenizer)
    single = SingleBatch(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_lengths)
    with pytest.raises(TypeError, match="PreferenceBatch"):
        DPOModule().compute_loss(single)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_a_few_steps_lower_the_loss(tiny_tokenizer, loss_type):
    torch.manual_seed(0)
    module = DPOModule(loss_type=loss_type, beta=0.5)
    batch = preference_batch(tiny_tokenizer)
    optimizer = torch.optim.AdamW([g for g in module.optimizer_param_groups()], lr=3e-3)
    losses = []
    for _ in range(6):
        loss, stats = module.compute_loss(batch)
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert losses[-1] < losses[0] - 0.05, losses
    assert stats["rewards/accuracies"] == 1.0


@pytest.mark.parametrize(("loss_type", "f_of_zero"), [("exponential", 1.0), ("savage", 0.25)])
def test_gpo_loss_types_are_selectable(tiny_tokenizer, loss_type, f_of_zero):
    # the policy starts as its reference: every margin z is 0 and the loss is f(0)
    # (exp(0) = 1; 1 / (1 + e^0)^2 = 1/4)
    module = DPOModule(loss_type=loss_type, beta=0.5)
    loss, stats = module.compute_loss(preference_batch(tiny_tokenizer))
    assert loss.item() == pytest.approx(f_of_zero, abs=1e-6)
    assert stats["rewards/margins"].item() == pytest.approx(0.0, abs=1e-6)
