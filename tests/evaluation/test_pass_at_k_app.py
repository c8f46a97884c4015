"""`python -m lit_rlhf.apps.pass_at_k` and `lit_rlhf.evaluation.verifiable` on the tiny model and
the bundled arithmetic problems, and with completions written by hand."""

from __future__ import annotations

import json

import pytest
import torch

import lit_rlhf.evaluation.verifiable as verifiable
from lit_rlhf.apps import pass_at_k as app
from lit_rlhf.evaluation.pass_at_k import pass_at_k
from lit_rlhf.evaluation.verifiable import check_answers

TINY = ["--config", "examples/verifiable_math.yaml", "--split", "test[:3]", "--data_args", "{max_prompt_length: 256}",
        "--n", "4", "--k", "1", "2", "4", "--max_new_tokens", "4", "--num_resamples", "500"]


def test_answers_checked_grouped_and_scored_by_hand():
    completions = [["#### 9", "it is 9.0", "#### 8", "#### 8"],     # 2 of 4 right; 9 and 8 tie: 9 came first
                   ["\\boxed{1/2}", "0.5", "#### 3", "nothing"]]   # 2 of 4 right; 1/2 wins 2 votes to 1
    result = check_answers(completions, ["9", "\\frac{1}{2}"], [1, 2, 4])
    assert result.correct == [[True, True, False, False], [True, True, False, False]]
    assert result.answers == [[0, 0, 1, 1], [0, 0, 1, None]]
    assert result.values["pass@2"] == pytest.approx([1 - 1 / 6] * 2)   # 1 - C(2,2)/C(4,2)
    assert result.values["avg@4"] == [0.5, 0.5] and result.values["pass@4"] == [1.0, 1.0]
    assert result.values["maj@4"] == [1.0, 1.0]
    with pytest.raises(ValueError, match="problem 1: the reference answer"):
        check_answers([["1"], ["2"]], ["1", "no answer here"], [1])


def test_the_command_on_the_tiny_model(tmp_path, capsys):
    torch.set_num_threads(1)
    out = tmp_path / "pk.json"
    result = app.main([*TINY, "--before", "tiny-random-llama", "--after", "tiny-random-llama", "--output", str(out)])
    printed = capsys.readouterr().out
    assert "3 problems, 4 samples each" in printed and "pass@4" in printed and '"temperature": 1.0' in printed
    saved = json.loads(out.read_text())
    assert saved["settings"]["sampling"] == {"max_new_tokens": 4, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                                             "do_sample": True}
    assert saved["metrics"] == ["avg@1", "pass@1", "maj@1", "avg@2", "pass@2", "maj@2", "avg@4", "pass@4", "maj@4"]
    assert len(saved["problems"]) == 3
    for problem in saved["problems"]:
        before, after = problem["before"], problem["after"]
        assert len(before["completions"]) == 4 and before["completions"] == after["completions"]  # same seed
        assert before["pass@2"] == pass_at_k(4, sum(before["correct"]), 2)
    assert saved["difference"]["pass@1"]["mean"] == 0.0
    assert result["summary"]["before"]["avg@4"]["n"] == 3


def test_a_policy_that_learned_shows_a_rise(monkeypatch, capsys):
    """The sampler replaced: `before` answers 0 everywhere, `after` the right answer 3 times in 4."""
    calls = []

    def fake(model, tokenizer, rows, sampling, batch_size, synced_gpus=False, seed=0, engine=None):
        calls.append(len(rows))
        if len(calls) == 1:
            return ["#### 0"] * len(rows)
        answers = app.heldout_problems(app.recipe_data("examples/verifiable_math.yaml") | {
            "init_args": {**app.recipe_data("examples/verifiable_math.yaml")["init_args"], "max_prompt_length": 256}},
            tokenizer, "test[:3]", 60).references
        return [f"#### {answers[i // 4]}" if i % 4 else "#### 0" for i in range(len(rows))]

    monkeypatch.setattr(verifiable, "generate_completions", fake)
    result = app.main([*TINY, "--before", "tiny-random-llama", "--after", "tiny-random-llama"])
    assert calls == [12, 12]
    diff = result["difference"]
    assert diff["avg@4"]["mean"] == pytest.approx(0.75) and diff["pass@1"]["mean"] == pytest.approx(0.75)
    assert diff["pass@4"]["mean"] == 1.0 and diff["maj@4"]["verdict"] == "improved"
    assert diff["maj@1"]["mean"] == 0.0  # the first sample of every problem is still "0"
    assert "improved" in capsys.readouterr().out


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        app.main([*TINY[:-6], "--n", "2", "--k", "4", "--before", "tiny-random-llama"])
