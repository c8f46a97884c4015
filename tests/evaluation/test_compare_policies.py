"""The paired comparison's scoring: shared-prompt reward scores, the optimised objective with the
EOS trick, and the gold read from held-out pairs."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.apps.compare_policies import gold_of_pairs, objective, reward_scores


def test_scores_of_several_completion_sets_equal_one_at_a_time(tiny_tokenizer):
    """Each prompt computed once for its completions (before and after; chosen and rejected)
    gives the scores of scoring each prompt + completion alone, in the callers' order."""
    from lit_rlhf.models.heads import load_scalar_model

    torch.manual_seed(0)
    model = load_scalar_model("tiny-random-llama", tiny_tokenizer).eval()
    pad, eos = tiny_tokenizer.pad_token_id, tiny_tokenizer.eos_token_id
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(5, 200, (n,), generator=g).tolist() for n in (9, 4, 12, 7, 5)]
    first = [torch.randint(5, 200, (n,), generator=g).tolist() + [eos] for n in (3, 6, 1, 4, 2)]
    second = [torch.randint(5, 200, (n,), generator=g).tolist() for n in (5, 1, 7, 2, 6)]
    together = reward_scores(model, pad, prompts, first, second, batch_size=4)  # 2 prompts per forward
    alone = [reward_scores(model, pad, [p], [c], batch_size=1)[0][0] for c_set in (first, second)
             for p, c in zip(prompts, c_set)]
    torch.testing.assert_close(torch.tensor(together[0] + together[1]), torch.tensor(alone), atol=1e-5, rtol=0)
    assert len(set(together[0])) == 5  # distinct rows, not one score repeated


def test_objective_applies_the_eos_trick_constant_only_without_eos():
    assert objective([0.5, -0.2], [[4, 2], [4, 5]], eos_token_id=2, missing_eos_score=None) == [0.5, -0.2]
    assert objective([0.5, -0.2], [[4, 2], [4, 5]], eos_token_id=2, missing_eos_score=-1.5) == [0.5, -1.5]


def test_gold_of_pairs_from_notes_or_scores():
    notes = [{"summaries": [{"note": "gold=0.2"}, {"note": "gold=0.8"}], "choice": 1}]
    assert gold_of_pairs(notes, "note") == [(0.8, 0.2)]
    assert gold_of_pairs([{"score_chosen": 0.25, "score_rejected": 0.5}], "scores") == [(0.25, 0.5)]
    with pytest.raises(ValueError, match="pair 0 has no 'gold=<score>' note"):
        gold_of_pairs([{"summaries": [{"note": ""}, {"note": "gold=1"}], "choice": 0}], "note")
