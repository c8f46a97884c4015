"""KTOModule: mismatched pairs, the z0 reference point, label sources, optimisation."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.modules.kto import KTOModule, mismatch_partners, mismatched_sequences
from lit_rlhf.models.logprobs import per_token_logps
from lit_rlhf.types import PreferenceBatch, SingleBatch

PROMPTS = ["Q: 1+1?\nA:", "Say hi.", "Name a colour:", "Count:"]
COMPLETIONS = [" 2", " hi there", " red", " 1 2 3"]


def tokens(tokenizer, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return p, c


def single_batch(tokenizer, prompts=PROMPTS, completions=COMPLETIONS, labels=None, rewards=None) -> SingleBatch:
    pairs = [tokens(tokenizer, p, c) for p, c in zip(prompts, completions)]
    length = max(len(p) + len(c) for p, c in pairs)
    ids = torch.full((len(pairs), length), tokenizer.pad_token_id, dtype=torch.long)
    keep = torch.zeros(len(pairs), length, dtype=torch.bool)
    scored = torch.zeros_like(keep)
    for i, (p, c) in enumerate(pairs):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        keep[i, : len(p) + len(c)] = True
        scored[i, len(p) : len(p) + len(c)] = True
    return SingleBatch(ids, keep, scored, torch.tensor([len(p) for p, _ in pairs]), rewards, labels)


def perturb(module: torch.nn.Module, seed: int = 0, scale: float = 0.05) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)


def test_mismatched_sequences_pair_prompt_i_with_completion_i_plus_1(tiny_tokenizer):
    batch = single_batch(tiny_tokenizer)
    ids, keep, scored = mismatched_sequences(
        batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_lengths, tiny_tokenizer.pad_token_id
    )
    n = len(PROMPTS)
    for i in range(n):
        p, c = tokens(tiny_tokenizer, PROMPTS[i], COMPLETIONS[(i + 1) % n])
        assert ids[i, keep[i]].tolist() == p + c
        assert ids[i, scored[i]].tolist() == c
        assert keep[i].sum() == len(p) + len(c) and keep[i, : len(p) + len(c)].all()  # right padded
        assert (ids[i, ~keep[i]] == tiny_tokenizer.pad_token_id).all()
    assert ids.shape[1] == max(keep.sum(1))
    with pytest.raises(ValueError, match="at least 2 rows"):
        mismatched_sequences(ids[:1], keep[:1], scored[:1], batch.prompt_lengths[:1], 0)


def test_rows_sharing_a_prompt_are_never_paired(tiny_tokenizer):
    """Completions of one prompt side by side (UltraFeedback's per instruction, as validation
    batches come): each row's completion goes to the next row with ANOTHER prompt, never to a
    row of its own prompt (with a shift by one row, rows 0, 2 and 4 got their own prompt back)."""
    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[1], PROMPTS[2], PROMPTS[2]]
    completions = [COMPLETIONS[0], COMPLETIONS[1], COMPLETIONS[2], COMPLETIONS[3], COMPLETIONS[0], COMPLETIONS[2]]
    batch = single_batch(tiny_tokenizer, prompts, completions)
    partners = mismatch_partners(batch.input_ids, batch.prompt_lengths)
    assert partners == [2, 2, 4, 4, 0, 0]
    ids, keep, scored = mismatched_sequences(
        batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_lengths, tiny_tokenizer.pad_token_id
    )
    for i, j in enumerate(partners):
        assert prompts[i] != prompts[j]
        p, c = tokens(tiny_tokenizer, prompts[i], completions[j])
        assert ids[i, keep[i]].tolist() == p + c and ids[i, scored[i]].tolist() == c
    # one prompt for every row: no mismatched pair at all
    same = single_batch(tiny_tokenizer, [PROMPTS[0]] * 3, COMPLETIONS[:3])
    assert mismatch_partners(same.input_ids, same.prompt_lengths) is None
    with pytest.raises(ValueError, match="share one prompt"):
        mismatched_sequences(same.input_ids, same.attention_mask, same.loss_mask, same.prompt_lengths, 0)


def test_the_raw_estimate_is_exactly_zero_while_the_policy_is_the_reference(tiny_tokenizer):
    """At the first step pi == pi_ref (a copy of the initial policy, dropout off: D7): the raw
    estimate is exactly 0, so a z0 of 0 there is no clamp at work."""
    module = KTOModule()
    batch = single_batch(tiny_tokenizer, labels=torch.tensor([True, False, True, False]))
    assert module.kl_estimate(batch).item() == 0.0
    _, stats = module.compute_loss(batch)
    assert stats["objective/kl_raw"].item() == 0.0 and stats["objective/kl"].item() == 0.0


def _hand_mismatched_logratio(module: KTOModule, tokenizer, ref_shift_per_token: float = 0.0) -> torch.Tensor:
    n = len(PROMPTS)
    ratios = []
    for i in range(n):
        p, c = tokens(tokenizer, PROMPTS[i], COMPLETIONS[(i + 1) % n])
        ids = torch.tensor([p + c])
        keep = torch.ones_like(ids, dtype=torch.bool)
        scored = torch.tensor([[False] * len(p) + [True] * len(c)])
        with torch.no_grad():
            policy = per_token_logps(module.policy, ids, keep, scored).sum()
            ref = per_token_logps(module.ref_model, ids, keep, scored).sum() + ref_shift_per_token * len(c)
        ratios.append(policy - ref)
    return torch.stack(ratios).mean()


@pytest.mark.parametrize("ref_shift", [-1.0, 1.0])  # reference made less / more likely: z0 > 0 / clamped to 0
def test_z0_is_the_detached_clamped_mean_mismatched_logratio(tiny_tokenizer, ref_shift):
    module = KTOModule()
    perturb(module.policy)
    frozen_logps = module.frozen_logps

    def shifted(name, input_ids, attention_mask, loss_mask, temperature=1.0, sharing=None):
        return frozen_logps(name, input_ids, attention_mask, loss_mask, temperature, sharing) + ref_shift * loss_mask

    module.frozen_logps = shifted
    batch = single_batch(tiny_tokenizer, labels=torch.tensor([True, False, True, False]))
    z0 = module.kl_estimate(batch).clamp(min=0)
    expected = _hand_mismatched_logratio(module, tiny_tokenizer, ref_shift)
    if ref_shift < 0:
        assert expected > 0
        torch.testing.assert_close(z0, expected, atol=1e-5, rtol=0)
    else:
        assert expected < 0
        assert z0.item() == 0.0
    assert not z0.requires_grad and z0.grad_fn is None
    # the loss uses that z0 and no gradient flows through it: only the matched forward has grad
    loss, stats = module.compute_loss(batch)
    torch.testing.assert_close(stats["objective/kl"], z0)
    torch.testing.assert_close(stats["objective/kl_raw"], expected, atol=1e-5, rtol=0)  # the unclamped estimate
    assert loss.requires_grad


def test_desirable_flags_from_labels_rewards_and_pairs(tiny_tokenizer):
    labelled = single_batch(tiny_tokenizer, labels=torch.tensor([True, False, False, True]))
    assert KTOModule().row_labels(labelled)[0].desirable.tolist() == [True, False, False, True]
    rewarded = single_batch(tiny_tokenizer, rewards=torch.tensor([0.5, -1.0, 2.0, 0.0]))  # mean 0.375
    assert KTOModule(labels_from="rewards").row_labels(rewarded)[0].desirable.tolist() == [True, False, True, False]
    tied = single_batch(tiny_tokenizer, rewards=torch.tensor([1.0, -1.0, 0.0, 0.0]))  # mean 0: rows 2, 3 tie
    labels, all_tied = KTOModule(labels_from="rewards").row_labels(tied)
    assert labels.desirable.tolist() == [True, False, False, False] and labels.tied.tolist() == [False, False, True, True]
    assert not all_tied
    _, stats = KTOModule(labels_from="rewards").compute_loss(tied)
    assert (stats["data/num_desirable"], stats["data/num_undesirable"], stats["data/num_tied"]) == (1, 1, 2)
    assert KTOModule(labels_from="rewards").row_labels(single_batch(tiny_tokenizer, rewards=torch.full((4,), 0.3)))[1]
    with pytest.raises(ValueError, match="no `labels`"):
        KTOModule().row_labels(rewarded)[0].desirable
    with pytest.raises(ValueError, match="no `rewards`"):
        KTOModule(labels_from="rewards").row_labels(labelled)[0].desirable
    pairs = PreferenceBatch(labelled.input_ids, labelled.attention_mask, labelled.loss_mask, labelled.prompt_lengths)
    assert KTOModule().row_labels(pairs)[0].desirable.tolist() == [True, True, False, False]  # chosen rows first
    with pytest.raises(ValueError, match="labels_from"):
        KTOModule(labels_from="scores")


def test_weights_scale_the_two_classes(tiny_tokenizer):
    batch = single_batch(tiny_tokenizer, labels=torch.tensor([True, True, True, True]))
    base = KTOModule()
    weighted = KTOModule(desirable_weight=2.0, undesirable_weight=7.0)
    loss, _ = base.compute_loss(batch)
    loss_w, _ = weighted.compute_loss(batch)
    torch.testing.assert_close(loss_w, 2.0 * loss)


@pytest.mark.parametrize("kind", ["labels", "pairs"])
def test_a_few_steps_lower_the_loss(tiny_tokenizer, kind):
    torch.manual_seed(0)
    module = KTOModule(beta=0.5)
    batch = single_batch(tiny_tokenizer, labels=torch.tensor([True, False, True, False]))
    if kind == "pairs":
        batch = PreferenceBatch(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_lengths)
    optimizer = torch.optim.AdamW(module.optimizer_param_groups(), lr=3e-3)
    losses = []
    for _ in range(6):
        loss, stats = module.compute_loss(batch)
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert losses[-1] < losses[0] - 0.01, losses
    assert stats["rewards/margins"] > 0


def test_a_single_prompt_batch_reuses_the_previous_z0(tiny_tokenizer):
    module = KTOModule()
    frozen_logps = module.frozen_logps
    module.frozen_logps = lambda *args, **kwargs: frozen_logps(*args, **kwargs) - args[3].float()  # ref less likely
    batch = single_batch(tiny_tokenizer, labels=torch.tensor([True, False, True, False]))
    z0 = module.kl_estimate(batch).clamp(min=0)  # training mode: remembered
    assert z0 > 0.5
    one = batch._replace(input_ids=batch.input_ids[:1], attention_mask=batch.attention_mask[:1],
                         loss_mask=batch.loss_mask[:1], prompt_lengths=batch.prompt_lengths[:1], labels=batch.labels[:1])
    assert module.kl_estimate(one).clamp(min=0).item() == pytest.approx(z0.item())
    rows = single_batch(tiny_tokenizer, [PROMPTS[0]] * 2, COMPLETIONS[:2])  # a chosen and a rejected of one prompt
    pair = PreferenceBatch(rows.input_ids, rows.attention_mask, rows.loss_mask, rows.prompt_lengths)
    assert module.kl_estimate(pair).clamp(min=0).item() == pytest.approx(z0.item())  # one pair = one prompt
    one_prompt = single_batch(tiny_tokenizer, [PROMPTS[0]] * 4, COMPLETIONS, labels=batch.labels)
    assert module.kl_estimate(one_prompt).clamp(min=0).item() == pytest.approx(z0.item())  # 4 rows, one prompt
    assert KTOModule().kl_estimate(one).clamp(min=0).item() == 0.0  # nothing seen yet


def test_an_all_tied_batch_skips_the_step_and_is_counted(tiny_tokenizer, tmp_path):
    import lightning as L

    def fit(rewards):
        torch.manual_seed(0)
        module = KTOModule(labels_from="rewards", lr=1e-2, lr_scheduler="constant", weight_decay=0.1)
        before = {k: v.clone() for k, v in module.policy.state_dict().items()}
        batch = single_batch(tiny_tokenizer, rewards=rewards)
        trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False, log_every_n_steps=1,
                            enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
        trainer.fit(module, torch.utils.data.DataLoader([batch], batch_size=None))
        moved = any(not torch.equal(before[k], v) for k, v in module.policy.state_dict().items())
        return module, trainer, moved

    module, trainer, moved = fit(torch.full((4,), 0.3))  # every reward equals the batch mean
    assert module.tied_batches == 1 and trainer.global_step == 1
    assert not moved  # no update at all (not even weight decay)
    assert float(trainer.callback_metrics["train/data/tied_batches"]) == 1.0
    assert float(trainer.callback_metrics["train/data/num_tied"]) == 4.0
    module, trainer, moved = fit(torch.tensor([1.0, -1.0, 0.0, 0.0]))  # two rows labelled: a real step
    assert module.tied_batches == 0 and moved
    assert float(trainer.callback_metrics["train/data/num_tied"]) == 2.0


def test_rows_sharing_a_prompt_share_its_forward_with_the_same_loss(tiny_tokenizer):
    """The collator numbers the prompts; the loss and the KL estimate are the same with the
    shared-prompt forward as with every row apart."""
    from lit_rlhf.data.collate import SingleCollator

    prompts, completions = ["Q: 1+1?\nA:", "Say hi."], [" 2", " hi", " two", " hi there"]
    examples = [{"_prompt_ids": tokens(tiny_tokenizer, prompts[i % 2], c)[0],
                 "_completion_ids": tokens(tiny_tokenizer, prompts[i % 2], c)[1], "_reward": r}
                for i, (c, r) in enumerate(zip(completions, [1.0, -1.0, -0.5, 0.5]))]
    batch = SingleCollator(tiny_tokenizer.pad_token_id, reward_mean=0.0, reward_std=1.0)(examples)
    assert batch.prompt_groups.tolist() == [0, 1, 0, 1]
    module = KTOModule(labels_from="rewards")
    perturb(module.policy)  # the policy away from the reference, so the estimate is not 0
    shared, shared_stats = module.compute_loss(batch)
    apart, apart_stats = module.compute_loss(batch._replace(prompt_groups=None))
    torch.testing.assert_close(shared, apart, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared_stats["objective/kl_raw"], apart_stats["objective/kl_raw"], atol=1e-5, rtol=1e-5)
    assert float(shared_stats["objective/kl_raw"]) != 0.0
