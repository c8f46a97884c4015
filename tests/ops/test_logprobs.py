import torch
import torch.nn.functional as F

from lit_rlhf.ops import position_ids_from_mask, selective_log_softmax, token_logps_from_logits


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
