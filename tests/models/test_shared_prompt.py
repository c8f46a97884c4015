"""Shared-prompt layout (`lit_rlhf.ops.shared_prompt`, models run on it by
`lit_rlhf.models.shared_prompt`): the packed rows, and log-probs, rewards and gradients equal to
the padded rows (fp32, 1e-5) for pairs (DPO, reward model) and groups (GRPO,
G = 4), tied and untied output layers, sdpa and eager attention, chunked and dense log-probs."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lit_rlhf.data.collate import PreferenceCollator, PromptCollator
from lit_rlhf.generation import token_logps_with_grad
from lit_rlhf.models import ScalarHeadModel, backbone_of
from lit_rlhf.models import shared_prompt as sp
from lit_rlhf.models.logprobs import per_token_logps
from lit_rlhf.ops.shared_prompt import build_layout
from lit_rlhf.rewards.sources import reward_model_scores
from lit_rlhf.types import PromptSharing

VOCAB, PAD, EOS = 97, 0, 1
ATOL = 1e-5


def tiny_lm(tied: bool, attention: str = "sdpa", seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=PAD, eos_token_id=EOS, tie_word_embeddings=tied, attn_implementation=attention)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    return model.eval()


def tokens(n: int, gen: torch.Generator) -> list[int]:
    return torch.randint(2, VOCAB, (n,), generator=gen).tolist()


def pair_batch(seed: int = 0):
    """3 pairs, prompts of 7/12/4 tokens, chosen and rejected of different lengths (EOS last)."""
    gen = torch.Generator().manual_seed(seed)
    examples = [{"_prompt_ids": tokens(p, gen), "_chosen_ids": tokens(c, gen) + [EOS], "_rejected_ids": tokens(r, gen) + [EOS]}
                for p, c, r in [(7, 3, 5), (12, 6, 1), (4, 0, 9)]]
    return PreferenceCollator(PAD)(examples)


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def assert_same_grads(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=ATOL, rtol=1e-4, msg=name)


def test_layout_of_one_pair_by_hand():
    # right padded: prompt [5, 6, 7], chosen [8, 9], rejected [10]; T = 5
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 10, PAD]])
    mask = ids != PAD
    layout = build_layout(ids, mask, PromptSharing(torch.tensor([3, 3]), torch.tensor([0, 0])))
    assert layout.input_ids.tolist() == [[5, 6, 7, 8, 9, 10]]
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 4, 3]]  # the rejected token continues from the prompt
    assert layout.segment_ids.tolist() == [[0, 0, 0, 1, 1, 2]]
    assert layout.token_index.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 5, -1]]
    allowed = layout.attention_bias(torch.float32)[0, 0] == 0
    assert allowed.tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 0, 0, 1],  # the rejected token sees the prompt and itself, not the chosen tokens
    ]


def test_left_padded_group_layout_and_no_empty_softmax_row():
    # left-padded prompt [PAD, 5, 6] with responses [7, EOS] and [8, PAD] (mask False after the cut)
    ids = torch.tensor([[PAD, 5, 6, 7, EOS], [PAD, 5, 6, 8, PAD]])
    mask = torch.tensor([[0, 1, 1, 1, 1], [0, 1, 1, 1, 0]], dtype=torch.bool)
    other = torch.tensor([[9, 9, 9, 9, 9]])  # a third group alone, longer than the shared row
    layout = build_layout(torch.cat([ids, other]), torch.cat([mask, torch.ones(1, 5, dtype=torch.bool)]),
                             PromptSharing(torch.tensor([3, 3, 3]), torch.tensor([4, 4, 7])))
    assert layout.input_ids.tolist() == [[5, 6, 7, EOS, 8], [9, 9, 9, 9, 9]]
    assert layout.position_ids[0].tolist() == [0, 1, 2, 3, 2]
    assert layout.token_index.tolist() == [[-1, 0, 1, 2, 3], [-1, 0, 1, 4, -1], [5, 6, 7, 8, 9]]
    bias = layout.attention_bias(torch.float32)
    assert bias.shape == (2, 1, 5, 5) and bool(torch.isfinite(bias.softmax(-1)).all())


def test_rows_of_a_group_with_different_prompts_are_refused():
    ids = torch.tensor([[5, 6, 7], [5, 9, 7]])
    with pytest.raises(ValueError, match="rows 0 and 1 .* prompts differ"):
        build_layout(ids, ids != PAD, PromptSharing(torch.tensor([2, 2]), torch.tensor([0, 0])))


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("chunk_size", [4, None])
def test_pair_logps_and_gradients_match_the_padded_rows(tied, attention, chunk_size):
    model = tiny_lm(tied, attention)
    batch = pair_batch()
    weights = torch.randn(batch.input_ids.shape, generator=torch.Generator().manual_seed(1))
    padded = per_token_logps(model, batch.input_ids, batch.attention_mask, batch.loss_mask, 0.7, chunk_size)
    (padded * weights).sum().backward()
    padded_grads = grads(model)
    shared = sp.shared_per_token_logps(model, batch.input_ids, batch.attention_mask, batch.loss_mask, batch.sharing, 0.7, chunk_size)
    (shared * weights).sum().backward()
    assert bool(padded.ne(0).any())
    torch.testing.assert_close(shared, padded, atol=ATOL, rtol=0)
    assert bool((shared[~batch.loss_mask] == 0).all())
    assert_same_grads(grads(model), padded_grads)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("micro_batch_size", [None, 3])
def test_grpo_group_logps_and_gradients_match_the_padded_rows(tied, micro_batch_size):
    """G = 4 responses of 3 left-padded prompts, cut after EOS; micro-batches of 3 split groups."""
    group, width = 4, 6
    gen = torch.Generator().manual_seed(2)
    prompts = PromptCollator(PAD)([{"_prompt_ids": tokens(n, gen)} for n in (5, 9, 2)])
    prompt_ids = prompts.input_ids.repeat_interleave(group, 0)  # (12, P)
    prompt_mask = prompts.attention_mask.repeat_interleave(group, 0)
    response_ids = torch.randint(2, VOCAB, (prompt_ids.shape[0], width), generator=gen)
    lengths = torch.randint(1, width + 1, (prompt_ids.shape[0],), generator=gen)
    response_mask = torch.arange(width)[None] < lengths[:, None]
    response_ids = response_ids.masked_fill(~response_mask, PAD)
    groups = torch.arange(prompt_ids.shape[0]) // group
    model = tiny_lm(tied)
    weights = torch.randn(response_ids.shape, generator=gen)
    args = (model, prompt_ids, prompt_mask, response_ids, response_mask, 1.3, micro_batch_size)
    padded = token_logps_with_grad(*args, chunk_size=4)
    (padded * weights).sum().backward()
    padded_grads = grads(model)
    shared = token_logps_with_grad(*args, chunk_size=4, groups=groups)
    (shared * weights).sum().backward()
    torch.testing.assert_close(shared, padded, atol=ATOL, rtol=0)
    assert_same_grads(grads(model), padded_grads)


def test_reward_scores_and_gradients_match_the_padded_rows():
    reward_model = ScalarHeadModel(backbone_of(tiny_lm(tied=False)))
    batch = pair_batch(seed=3)
    padded = reward_model.score(batch.input_ids, batch.attention_mask)  # (2B,)
    (padded * torch.arange(1.0, 7.0)).sum().backward()
    padded_grads = grads(reward_model)
    shared = sp.shared_scalar_scores(reward_model, batch.input_ids, batch.attention_mask, batch.sharing)
    (shared * torch.arange(1.0, 7.0)).sum().backward()
    torch.testing.assert_close(shared, padded, atol=ATOL, rtol=0)
    assert_same_grads(grads(reward_model), padded_grads)


def test_rollout_reward_scores_read_each_completion_at_its_own_last_token():
    reward_model = ScalarHeadModel(backbone_of(tiny_lm(tied=True)))
    gen = torch.Generator().manual_seed(4)
    prompts = PromptCollator(PAD)([{"_prompt_ids": tokens(n, gen)} for n in (3, 6)])
    prompt_ids, prompt_mask = prompts.input_ids.repeat_interleave(4, 0), prompts.attention_mask.repeat_interleave(4, 0)
    lengths = torch.tensor([1, 4, 2, 4, 3, 3, 1, 2])
    response_mask = torch.arange(4)[None] < lengths[:, None]
    response_ids = torch.randint(2, VOCAB, (8, 4), generator=gen).masked_fill(~response_mask, PAD)
    ids, mask = torch.cat([prompt_ids, response_ids], 1), torch.cat([prompt_mask, response_mask], 1)
    with torch.no_grad():
        padded = reward_model_scores(reward_model, ids, mask, micro_batch_size=3)
        shared = reward_model_scores(reward_model, ids, mask, 3, torch.arange(8) // 4, prompt_ids.shape[1])
    torch.testing.assert_close(shared, padded, atol=ATOL, rtol=0)


def test_attention_without_4d_masks_falls_back_to_the_padded_rows(monkeypatch, caplog):
    model = tiny_lm(tied=False)
    model.config._attn_implementation = "flash_attention_2"  # read only by decide_layout here
    batch = pair_batch()
    called = []
    monkeypatch.setattr(sp, "per_token_logps", lambda *args, **kwargs: called.append(args[1].shape) or "padded")
    with caplog.at_level(logging.WARNING, logger="lit_rlhf.models.shared_prompt"):
        out = sp.grouped_token_logps(model, batch.input_ids, batch.attention_mask, batch.loss_mask, batch.sharing)
        sp.grouped_token_logps(model, batch.input_ids, batch.attention_mask, batch.loss_mask, batch.sharing)
    assert out == "padded" and called == [batch.input_ids.shape] * 2
    warnings = [r.getMessage() for r in caplog.records if "shared prompts are off" in r.getMessage()]
    assert len(warnings) == 1 and "flash_attention_2" in warnings[0]  # named once per model


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_bf16_autocast_takes_the_layout_mask(attention):
    """Under bf16 autocast the float32 mask meets bf16 queries: the layout runs and agrees."""
    model = tiny_lm(tied=False, attention=attention)
    batch = pair_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        padded = per_token_logps(model, batch.input_ids, batch.attention_mask, batch.loss_mask, 1.0, 4)
        shared = sp.shared_per_token_logps(model, batch.input_ids, batch.attention_mask, batch.loss_mask, batch.sharing, 1.0, 4)
    assert shared.dtype == torch.float32
    torch.testing.assert_close(shared, padded, atol=2e-2, rtol=0)


def test_rows_longer_than_a_sliding_window_use_the_padded_rows(monkeypatch, caplog):
    batch = pair_batch()
    longest = int(batch.attention_mask.sum(dim=1).max())
    fits = tiny_lm(tied=False)
    fits.config.sliding_window = longest
    assert sp.decide_layout(fits) == longest and sp.use_layout(fits, batch.attention_mask, batch.sharing)
    model = tiny_lm(tied=False)
    model.config.sliding_window = longest - 1
    called = []
    monkeypatch.setattr(sp, "shared_per_token_logps", lambda *args, **kwargs: called.append(1))
    with caplog.at_level(logging.WARNING, logger="lit_rlhf.models.shared_prompt"):
        padded = sp.grouped_token_logps(model, batch.input_ids, batch.attention_mask, batch.loss_mask, batch.sharing)
        sp.grouped_token_logps(model, batch.input_ids, batch.attention_mask, batch.loss_mask, batch.sharing)
    assert not called and padded.shape == batch.input_ids.shape
    warnings = [r.getMessage() for r in caplog.records if "sliding attention window" in r.getMessage()]
    assert len(warnings) == 1 and f"rows of {longest} tokens" in warnings[0]  # named once per model