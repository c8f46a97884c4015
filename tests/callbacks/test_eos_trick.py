"""EOSTrickCallback (D23): responses without EOS get a constant score, or a penalty."""

from __future__ import annotations

import pytest
import torch

from callbacks import EOSTrickCallback
from lit_rlhf.types import Rollout


def _rollout(scores, has_eos):
    n = len(scores)
    return Rollout(
        prompt_ids=torch.zeros(n, 2, dtype=torch.long), prompt_mask=torch.ones(n, 2, dtype=torch.bool),
        response_ids=torch.zeros(n, 3, dtype=torch.long), response_attention_mask=torch.ones(n, 3, dtype=torch.bool),
        has_eos=torch.tensor(has_eos), logps=torch.zeros(n, 3), scores=torch.tensor(scores),
    )


def test_replace_sets_a_constant_score():
    rollout = _rollout([0.5, 2.0, -3.0, 1.0], [True, False, False, True])
    out = EOSTrickCallback().on_rollout_scores(None, object(), rollout)
    assert out.scores.tolist() == [0.5, -1.0, -1.0, 1.0]
    assert rollout.scores.tolist() == [0.5, 2.0, -3.0, 1.0]  # the rollout is immutable
    out = EOSTrickCallback(score=-5.0).on_rollout_scores(None, object(), rollout)
    assert out.scores.tolist() == [0.5, -5.0, -5.0, 1.0]


def test_subtract_lowers_the_score():
    rollout = _rollout([0.5, 2.0, -3.0], [True, False, False])
    out = EOSTrickCallback(mode="subtract", penalty=0.25).on_rollout_scores(None, object(), rollout)
    assert out.scores.tolist() == [0.5, 1.75, -3.25]


def test_bad_mode_is_rejected():
    with pytest.raises(ValueError, match="replace"):
        EOSTrickCallback(mode="clip")
