"""RewardModule without a Trainer: where the reward is read (D12, D14), head init (D11),
normalisation (D15), export to plain transformers, margins, non-finite losses, metric helpers."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lit_rlhf import models
from lit_rlhf.modules import RewardModule
from lit_rlhf.training.reward_metrics import (
    PreferenceRecords,
    accuracy_table,
    calibration_buckets,
    calibration_figure,
    grouped_accuracy,
)
from lit_rlhf.types import PreferenceBatch

SEQS = [[40, 41, 42, 43, 44, 45], [50, 51, 52], [60, 61, 62, 63]]  # token ids before EOS


@pytest.fixture(scope="module")
def module():
    torch.manual_seed(0)
    return RewardModule(model=models.TINY_RANDOM_LLAMA).eval()


def _pad(seqs, eos, pad, side):
    rows = [s + [eos] for s in seqs]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        sl = slice(0, len(r)) if side == "right" else slice(width - len(r), width)
        ids[i, sl] = torch.tensor(r)
        mask[i, sl] = True
    return ids, mask


@torch.no_grad()
def test_reward_is_read_at_the_eos_token_right_padded(module):
    tok = module.tokenizer
    ids, mask = _pad(SEQS, tok.eos_token_id, tok.pad_token_id, "right")
    per_position = module.reward_model(ids, mask)  # (B, T)
    eos_index = (ids == tok.eos_token_id).int().argmax(dim=1)
    assert eos_index.tolist() == [6, 3, 4]
    expected = per_position[torch.arange(3), eos_index]
    torch.testing.assert_close(module(ids, mask), expected, rtol=0, atol=0)
    # the value at the last padded position is a different number: the index matters
    assert not torch.allclose(per_position[1, -1], expected[1])


@torch.no_grad()
def test_reward_is_read_at_the_eos_token_left_padded_and_equals_right_padded(module):
    tok = module.tokenizer
    right = module(*_pad(SEQS, tok.eos_token_id, tok.pad_token_id, "right"))
    ids, mask = _pad(SEQS, tok.eos_token_id, tok.pad_token_id, "left")
    assert (ids[:, -1] == tok.eos_token_id).all()
    left = module(ids, mask)
    torch.testing.assert_close(left, module.reward_model(ids, mask)[:, -1], rtol=0, atol=0)
    torch.testing.assert_close(left, right, rtol=0, atol=1e-5)  # D14, fp32


@torch.no_grad()
def test_reward_without_padding_is_the_last_position(module):
    tok = module.tokenizer
    ids = torch.tensor([SEQS[0] + [tok.eos_token_id], [70, 71, 72, 73, 74, 75, tok.eos_token_id]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    torch.testing.assert_close(module(ids, mask), module.reward_model(ids, mask)[:, -1], rtol=0, atol=0)
    # and a row scored alone equals the same row inside a padded batch
    padded = module(*_pad(SEQS, tok.eos_token_id, tok.pad_token_id, "right"))
    alone = module(ids[:1], mask[:1])
    torch.testing.assert_close(alone, padded[:1], rtol=0, atol=1e-5)


def test_head_init_std_on_a_wide_head_and_module_head_is_d11():
    torch.manual_seed(0)
    head = models.init_scalar_head(nn.Linear(4096, 1))
    target = 1.0 / math.sqrt(4096 + 1)
    assert abs(head.weight.std().item() - target) / target < 0.10
    assert head.bias.item() == 0.0
    torch.manual_seed(0)
    module = RewardModule()
    w = module.reward_model.head.weight
    assert w.shape == (1, 64) and module.reward_model.head.bias.item() == 0.0
    # 64 draws: std within 25% of 1/sqrt(65) (a default nn.Linear init, U(-1/8, 1/8), has std 0.072 vs 0.124)
    assert abs(w.std().item() - 1 / math.sqrt(65)) / (1 / math.sqrt(65)) < 0.25


def test_normalize_to_sets_mean_reference_reward_to_zero(module):
    prompts = [f"POST: story number {i}\n\nTL;DR:" for i in range(7)]
    refs = [f" summary {i} of the story" for i in range(7)]
    original = module.reward_model.head.bias.detach().clone()
    try:
        before_scores = module.score_texts(prompts, refs, batch_size=3)
        before, after = module.normalize_to(prompts, refs, batch_size=3)
        assert before == pytest.approx(before_scores.double().mean().item(), abs=1e-6)
        assert abs(before) > 1e-3  # the test is not vacuous
        assert abs(after) < 1e-6
        rescored = module.score_texts(prompts, refs, batch_size=4)
        assert abs(rescored.double().mean().item()) < 1e-4
        torch.testing.assert_close(rescored, before_scores - before, rtol=0, atol=1e-5)
        assert module.reward_model.head.bias.item() == pytest.approx(original.item() - before, abs=1e-6)
        assert "reward_model.head.bias" in module.state_dict()  # so it lives in checkpoints
    finally:
        with torch.no_grad():
            module.reward_model.head.bias.copy_(original)


def test_score_texts_matches_the_collated_forward(module):
    from lit_rlhf.data.collate import PreferenceCollator
    from lit_rlhf.data.formatting import encode_completion, encode_prompt

    tok = module.tokenizer
    ex = {"_prompt_ids": encode_prompt(tok, "Q: hi"), "_chosen_ids": encode_completion(tok, " yes"),
          "_rejected_ids": encode_completion(tok, " no no")}
    batch = PreferenceCollator(tok.pad_token_id)([ex])
    chosen, rejected = module.pair_rewards(batch)
    scores = module.score_texts(["Q: hi", "Q: hi"], [" yes", " no no"])
    torch.testing.assert_close(scores, torch.cat([chosen, rejected]).detach(), rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------
# export
# ------------------------------------------------------------------------------------------


def _right_padded_batch(tok):
    return _pad([[40, 41, 42], [43, 44, 45, 46, 47], [48]], tok.eos_token_id, tok.pad_token_id, "right")


@torch.no_grad()
def test_export_llama_bias_zero_plain_transformers_equals_module(module, tmp_path):
    from transformers import AutoModelForSequenceClassification

    assert module.reward_model.head.bias.item() == 0.0
    module.export_hf(tmp_path)
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert plain.config.num_labels == 1 and plain.config.pad_token_id == module.tokenizer.pad_token_id
    ids, mask = _right_padded_batch(module.tokenizer)
    expected = module(ids, mask)
    got = plain(input_ids=ids, attention_mask=mask.long()).logits.squeeze(-1)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@torch.no_grad()
def test_export_llama_with_bias_goes_to_config_and_our_loader_adds_it(tmp_path, caplog):
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(1)
    module = RewardModule().eval()
    module.reward_model.head.bias.fill_(0.75)
    with caplog.at_level("WARNING"):
        module.export_hf(tmp_path)
    assert "reward_bias" in caplog.text and "plain transformers" in caplog.text
    ids, mask = _right_padded_batch(module.tokenizer)
    expected = module(ids, mask)
    loaded = models.load_reward_model(str(tmp_path))
    torch.testing.assert_close(loaded.score(ids, mask), expected, rtol=0, atol=1e-5)
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert plain.config.reward_bias == pytest.approx(0.75)
    got = plain(input_ids=ids, attention_mask=mask.long()).logits.squeeze(-1)
    torch.testing.assert_close(got, expected - 0.75, rtol=0, atol=1e-5)  # documented: reward - bias


@pytest.fixture(scope="module")
def tiny_neox_dir(tmp_path_factory, tiny_tokenizer):
    """A tiny GPT-NeoX causal LM (LayerNorm with bias, as Pythia) saved with the byte tokenizer."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(vocab_size=len(tiny_tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=128, eos_token_id=tiny_tokenizer.eos_token_id,
                           bos_token_id=tiny_tokenizer.bos_token_id, pad_token_id=tiny_tokenizer.pad_token_id)
    torch.manual_seed(2)
    model = GPTNeoXForCausalLM(config)
    with torch.no_grad():  # non-trivial final LayerNorm so the fold is tested on real values
        model.gpt_neox.final_layer_norm.bias.normal_(0, 0.1)
        model.gpt_neox.final_layer_norm.weight.normal_(1, 0.1)
    path = tmp_path_factory.mktemp("neox")
    model.save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


@torch.no_grad()
def test_export_layernorm_model_folds_the_bias_exactly(tiny_neox_dir, tmp_path):
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(3)
    module = RewardModule(model=str(tiny_neox_dir)).eval()
    module.reward_model.head.bias.fill_(-1.25)
    norm_bias = module.reward_model.backbone.final_layer_norm.bias.clone()
    module.export_hf(tmp_path)
    # the module itself is untouched by the export
    torch.testing.assert_close(module.reward_model.backbone.final_layer_norm.bias, norm_bias, rtol=0, atol=0)
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert plain.config.reward_bias == 0.0 and plain.config.reward_bias_folded is True
    ids, mask = _right_padded_batch(module.tokenizer)
    expected = module(ids, mask)
    got = plain(input_ids=ids, attention_mask=mask.long()).logits.squeeze(-1)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(models.load_reward_model(str(tmp_path)).score(ids, mask), expected, rtol=0, atol=1e-5)


def test_load_reward_model_errors_clearly(tmp_path):
    with pytest.raises(models.ModelNotFoundError, match="does not exist"):
        models.load_reward_model(str(tmp_path / "missing.ckpt"))
    bogus = tmp_path / "bogus.ckpt"
    torch.save({"state_dict": {"policy.w": torch.zeros(1)}, "hyper_parameters": {"model": "tiny-random-llama"}}, bogus)
    with pytest.raises(ValueError, match="not a RewardModule checkpoint"):
        models.load_reward_model(str(bogus))


# ------------------------------------------------------------------------------------------
# loss wiring: margin, non-finite
# ------------------------------------------------------------------------------------------


def _pair_batch(tok, margin=None):
    ids, mask = _pad([[40, 41], [42, 43, 44], [45], [46, 47]], tok.eos_token_id, tok.pad_token_id, "right")
    return PreferenceBatch(ids, mask, mask.clone(), torch.zeros(4, dtype=torch.long), margin,
                           {"batch": ["b1", "b2"], "confidence": [1, 9]})


def test_use_margin_without_margin_is_a_clear_error_and_with_margin_shifts_the_loss():
    from lit_rlhf.losses import bradley_terry_loss

    module = RewardModule(use_margin=True)
    with pytest.raises(ValueError, match="use_margin=True.*no margin.*margin_from"):
        module.training_step(_pair_batch(module.tokenizer), 0)
    margin = torch.tensor([1.0, 3.0])
    batch = _pair_batch(module.tokenizer, margin)
    loss = module.training_step(batch, 0)
    chosen, rejected = module.pair_rewards(batch)
    torch.testing.assert_close(loss, bradley_terry_loss(chosen, rejected, margin).loss)
    assert not torch.allclose(loss, bradley_terry_loss(chosen, rejected).loss)


def test_non_finite_loss_raises_naming_the_step_before_any_update():
    module = RewardModule()
    with torch.no_grad():
        module.reward_model.head.weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="non-finite loss at global step 0"):
        module.training_step(_pair_batch(module.tokenizer), 0)


def test_non_finite_loss_is_a_counted_skip_on_request():
    module = RewardModule(on_nonfinite="skip")
    with torch.no_grad():
        module.reward_model.head.weight.fill_(float("nan"))
    assert module.training_step(_pair_batch(module.tokenizer), 0) is None  # Lightning skips backward and the step
    assert module.skipped_steps == 1


def test_wrong_batch_type_is_a_clear_error(module):
    with pytest.raises(TypeError, match="needs a PreferenceBatch"):
        module.training_step((torch.zeros(2, 3),), 0)


# ------------------------------------------------------------------------------------------
# grouped accuracy (D16), calibration (D18), DDP-syncable records
# ------------------------------------------------------------------------------------------


def test_grouped_accuracy_and_table():
    correct = torch.tensor([True, False, True, True, False])
    rows = grouped_accuracy(correct, ["10", "2", "2", "", "10"])
    assert rows == [("2", 0.5, 2), ("10", 0.5, 2)]  # numeric order, empty labels left out
    rows = grouped_accuracy(correct, ["b", "a", "a", "a", "b"])
    assert rows == [("a", 2 / 3, 3), ("b", 0.5, 2)]
    table = accuracy_table("batch", rows)
    assert table.splitlines()[0] == "| batch | accuracy | pairs |"
    assert "| a | 0.6667 | 3 |" in table


def test_calibration_buckets_by_reward_difference():
    diffs = torch.tensor([0.1, -0.2, 0.3, 2.0, -3.0, 4.0])
    buckets = calibration_buckets(diffs, 3)
    assert [b["count"] for b in buckets] == [2, 2, 2]
    assert [b["accuracy"] for b in buckets] == [0.5, 1.0, 0.5]  # |d| sorted: (.1,-.2), (.3, 2), (-3, 4)
    assert buckets[0]["abs_diff"] == pytest.approx(0.15)
    assert buckets[2]["predicted"] == pytest.approx((torch.sigmoid(torch.tensor(3.0)) + torch.sigmoid(torch.tensor(4.0))).item() / 2)
    fig = calibration_figure(buckets)
    assert len(fig.axes[0].lines) == 2


def test_preference_records_round_trip_labels():
    records = PreferenceRecords(("batch", "confidence", "absent"))
    records.update(torch.tensor([1.0, -1.0]), {"batch": ["batch13", "bätch/7"], "confidence": [3, None]})
    records.update(torch.tensor([0.5]), {"batch": ["batch13"], "confidence": [9]})
    diffs, groups = records.compute()
    torch.testing.assert_close(diffs, torch.tensor([1.0, -1.0, 0.5]))
    assert groups == {"batch": ["batch13", "bätch/7", "batch13"], "confidence": ["3", "", "9"]}
    with pytest.raises(ValueError, match="meta\\['batch'\\] has 1 values for 2 pairs"):
        records.update(torch.tensor([1.0, 2.0]), {"batch": ["x"]})
