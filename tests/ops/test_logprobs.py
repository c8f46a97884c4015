import torch
import torch.nn.functional as F

from lit_rlhf.ops import per_token_logps, position_ids_from_mask, selective_log_softmax, token_logps_from_logits


def test_position_ids_under_left_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]]).bool()
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]]
    # right padding leaves the real tokens at 0..L-1 too
    assert position_ids_from_mask(torch.tensor([[1, 1, 0]]).bool()).tolist() == [[0, 1, 0]]


def test_selective_log_softmax_fp32():
    gen = torch.Generator().manual_seed(0)
    logits = 5 * torch.randn(2, 3, 11, generator=gen)
    index = torch.randint(0, 11, (2, 3), generator=gen)
    expected = F.log_softmax(logits, -1).gather(-1, index.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(selective_log_softmax(logits, index), expected, atol=1e-6, rtol=0)


def test_selective_log_softmax_bf16():
    gen = torch.Generator().manual_seed(0)
    logits = (5 * torch.randn(2, 3, 11, generator=gen)).bfloat16()
    index = torch.randint(0, 11, (2, 3), generator=gen)
    out = selective_log_softmax(logits, index)
    assert out.dtype == torch.float32  # upcast: no bf16 rounding of the log-probs
    exact = F.log_softmax(logits.float(), -1).gather(-1, index.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out, exact, atol=1e-6, rtol=0)
    in_bf16 = F.log_softmax(logits, -1).gather(-1, index.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out, in_bf16.float(), atol=0.1, rtol=0.02)


def test_token_logps_from_logits_shift_and_temperature():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 7, generator=gen)
    ids = torch.randint(0, 7, (2, 4), generator=gen)
    out = token_logps_from_logits(logits, ids, temperature=0.7)
    assert (out[:, 0] == 0).all()
    # column t scores ids[:, t] under logits[:, t - 1] / temperature
    expected = F.log_softmax(logits[:, :-1] / 0.7, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(out[:, 1:], expected)


def test_left_and_right_padding_give_same_logps(tiny_model, tiny_tokenizer):
    pad = tiny_tokenizer.pad_token_id
    rows = [tiny_tokenizer(text)["input_ids"] for text in ("hello world, this is a test", "a b")]
    width = max(len(r) for r in rows)
    right = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    left = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    right_mask, left_mask = right != pad, left != pad
    # score every real token except the first of each row (it has no context)
    right_loss = right_mask & (position_ids_from_mask(right_mask) > 0)
    left_loss = left_mask & (position_ids_from_mask(left_mask) > 0)
    with torch.no_grad():
        right_logps = per_token_logps(tiny_model, right, right_mask, right_loss)
        left_logps = per_token_logps(tiny_model, left, left_mask, left_loss)
    for b, row in enumerate(rows):
        n = len(row)
        assert (right_logps[b, n:] == 0).all() and (left_logps[b, : width - n] == 0).all()
        torch.testing.assert_close(left_logps[b, width - n :], right_logps[b, :n], atol=1e-5, rtol=0)
        assert (right_logps[b, 1:n] < 0).all()  # real log-probs, not the masked zeros
