"""Reward model vs an external judge (N+ Detail 17): the agreement statistic by hand, and the
`lit_rlhf.apps.judge_agreement` entry point on the tiny model against a real HTTP chat judge."""

from __future__ import annotations

import json
import re

import pytest
import torch

from lit_rlhf.judges import Judgement, agreement, order_is_swapped, wilson_interval

KEY_ENV = "LIT_RLHF_TEST_JUDGE_KEY"


def verdicts(*winners: str) -> list[Judgement]:
    return [Judgement(w) for w in winners]


def test_agreement_by_hand():
    # decisive for both: items 0, 1, 2 (a/a agree, a/b disagree, b/b agree); item 3 a tie of x,
    # item 4 invalid for x, item 5 a tie of y: excluded and counted
    x = verdicts("a", "a", "b", "tie", "invalid", "b")
    y = verdicts("a", "b", "b", "a", "a", "tie")
    stats = agreement(x, y)
    assert (stats.n, stats.num_decisive, stats.agree, stats.undecided_x, stats.undecided_y) == (6, 3, 2, 2, 1)
    assert stats.rate == pytest.approx(2 / 3)
    assert (stats.ci_low, stats.ci_high) == pytest.approx(wilson_interval(2, 3))
    assert agreement(y, x)._replace(undecided_x=2, undecided_y=1) == stats  # symmetric
    assert agreement(verdicts("tie"), verdicts("a")).num_decisive == 0
    with pytest.raises(ValueError, match="different numbers of items"):
        agreement(x, y[:2])


def prefer_longer(server):
    """A judge that prefers the longer summary (the one shown first on equal lengths)."""

    def behaviour(request):
        text = server.user_message(request)
        shown_a = re.search(r"Summary A:\n(.*?)\n\n###", text, re.S).group(1)
        shown_b = re.search(r"Summary B:\n(.*?)\n\n###", text, re.S).group(1)
        return ("reply", f"Comparison: fine.\nPreferred: {'A' if len(shown_a) >= len(shown_b) else 'B'}")

    return behaviour


def test_entry_point_on_the_tiny_model(chat_server, tmp_path, monkeypatch):
    from lit_rlhf import models
    from lit_rlhf.apps import judge_agreement
    from lit_rlhf.apps.compare_policies import reward_scores
    from lit_rlhf.data import TLDRPreferenceDataModule
    from lit_rlhf.rewards.sources import load_reward_model

    monkeypatch.setenv(KEY_ENV, "sk-test")
    chat_server.behaviour = prefer_longer(chat_server)
    judge = {"class_path": "lit_rlhf.judges.ChatAPIJudge",
             "init_args": {"base_url": chat_server.base_url, "model": "judge-model", "api_key_env": KEY_ENV, "seed": 3,
                           "template": "tldr", "max_retries": 0, "timeout_s": 5.0}}
    (tmp_path / "judge.yaml").write_text(json.dumps(judge))
    n = 6
    torch.manual_seed(0)  # the tiny model and its fresh D11 head are random: the same draw for both loads
    result = judge_agreement.main([
        "--reward_model", models.TINY_RANDOM_LLAMA, "--pairs", "bundled:keyfact_comparisons", "--split", "test",
        "--num_pairs", str(n), "--judge", str(tmp_path / "judge.yaml"), "--output_dir", str(tmp_path / "out"),
    ])

    # the reward model's verdicts: its scores of the dataset's own token ids (prompt left padded,
    # completion + EOS), so the entry point's text path scores exactly what training scores
    tokenizer = models.load_tokenizer(models.TINY_RANDOM_LLAMA)
    torch.manual_seed(0)
    reward_model = load_reward_model(models.TINY_RANDOM_LLAMA, tokenizer).eval()
    ds = TLDRPreferenceDataModule(path="bundled:keyfact_comparisons", tokenizer=tokenizer, train_split=None,
                                  val_split="test").dataset("val").select(range(n))
    chosen, rejected = reward_scores(reward_model, tokenizer.pad_token_id, ds["_prompt_ids"], ds["_chosen_ids"],
                                     ds["_rejected_ids"])
    by_reward = ["a" if c > r else "b" for c, r in zip(chosen, rejected)]
    # the judge's verdicts: the longer summary, mapped back through the random order it was shown
    by_judge = []
    for i, (a, b) in enumerate(zip(ds["chosen"], ds["rejected"])):
        first_is_a = not order_is_swapped(3, i)
        shown_first, shown_second = (a, b) if first_is_a else (b, a)
        first_wins = len(shown_first) >= len(shown_second)
        by_judge.append("a" if first_wins == first_is_a else "b")
    assert 0 < by_judge.count("a") < n or len(set(by_reward)) > 1  # not a degenerate fixture

    rows = [json.loads(line) for line in (tmp_path / "out" / "pairs.jsonl").read_text().splitlines()]
    assert [r["reward_model"] for r in rows] == by_reward
    assert [r["judge"] for r in rows] == by_judge
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    agree = sum(x == y for x, y in zip(by_reward, by_judge))
    assert metrics["agreement"]["successes"] == agree and metrics["agreement"]["n"] == n
    assert metrics["agreement"]["rate"] == pytest.approx(agree / n)
    a = metrics["agreement"]
    assert 0.0 <= a["exact_low"] <= a["rate"] <= a["exact_high"] <= 1.0
    assert metrics["reward_model_accuracy"]["successes"] == by_reward.count("a")
    assert metrics["judge_accuracy"]["successes"] == by_judge.count("a")
    assert result["metrics"]["num_pairs"] == n and len(chat_server.requests) == n
