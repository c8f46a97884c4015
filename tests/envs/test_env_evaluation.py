"""Held-out evaluation of a policy on a multi-turn environment (`lit_rlhf.evaluation.episodes`,
`python -m lit_rlhf.apps.compare_env_policies`)."""

from __future__ import annotations

import json

import pytest
from lit_rlhf.apps.compare_env_policies import main, summarise
from lit_rlhf.envs import ChatFormat
from lit_rlhf.envs.rollout import run_episodes
from lit_rlhf.evaluation.episodes import evaluate_episodes
from lit_rlhf.generation import SamplingConfig, generate_responses
from tests.envs.turn_envs import CountingEnv
from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.usefixtures("one_thread")

ROWS = [{"prompt": f"What is {a} + {b}?", "reference": str(a + b)} for a, b in ((2, 3), (10, 7), (4, 4))]


def answer_length(prompts, completions, **columns):
    return [float(len(c)) for c in completions]


def test_each_episode_is_the_greedy_episode_of_training_scored_as_training_scores_it(eos_prone_tiny, tiny_tokenizer):
    """The records hold what `run_episodes` gives for the same rows and seeds under greedy
    decoding, the reward function read on the last policy turn, and the environment's return."""
    env = CountingEnv(3, prompt_column="prompt")  # several turns, a reward on each
    records = evaluate_episodes(eos_prone_tiny, tiny_tokenizer, env, ROWS, [answer_length], max_turns=3,
                                max_episode_tokens=60, max_new_tokens=12, batch_size=2)
    tok = tiny_tokenizer
    chat = ChatFormat(tok)

    def generate(ids, mask, sampling):
        return (*generate_responses(eos_prone_tiny, ids, mask, sampling, tok.eos_token_id, tok.pad_token_id), None)

    expected = []
    for start in (0, 2):
        chunk = ROWS[start:start + 2]
        expected += run_episodes([env.fork() for _ in chunk], chunk, list(range(start, start + len(chunk))),
                                 [chat.prompt_ids(r["prompt"]) for r in chunk], generate, chat,
                                 SamplingConfig.greedy(12), 3, 60)
    assert len(records) == len(ROWS)
    for record, t in zip(records, expected):
        assert record["conversation"] == t.conversation(tok)
        assert record["answer"] == t.final_text
        assert record["rewards"] == {"answer_length": float(len(t.final_text)), "environment": t.reward}
        assert (record["turns"], record["tool_calls"], record["stop_reason"]) == (len(t.turns), len(t.tool_calls),
                                                                                  t.stop_reason)
    assert max(r["turns"] for r in records) > 1  # the eos-prone model's episodes go on after a turn
    again = evaluate_episodes(eos_prone_tiny, tiny_tokenizer, env, ROWS, [answer_length], max_turns=3,
                              max_episode_tokens=60, max_new_tokens=12, batch_size=3)
    assert again == records  # deterministic, whatever the batching


def record(correct: float, calls: int, errors: int, env: float = 0.0) -> dict:
    return {"rewards": {"MathAnswerReward": correct, "environment": env}, "tool_calls": calls, "tool_errors": errors,
            "turns": 1 + calls}


def test_summary_figures_by_hand():
    before = [record(0, 0, 0), record(1, 0, 0), record(0, 1, 1, -0.1), record(0, 0, 0)]
    after = [record(1, 1, 0), record(1, 1, 0), record(1, 1, 0), record(0, 2, 1, -0.1)]
    out = summarise(before, after)
    accuracy = out["rewards"]["MathAnswerReward"]
    assert (accuracy["difference"]["mean_before"], accuracy["difference"]["mean_after"]) == (0.25, 0.75)
    assert accuracy["difference"]["mean_diff"] == pytest.approx(0.5)
    assert (accuracy["sign_test"]["positive"], accuracy["sign_test"]["negative"], accuracy["sign_test"]["ties"]) == (2, 0, 2)
    use = out["tool_use"]
    # a working call: more calls than failed ones (before: none; after: all four)
    assert use["episodes_with_a_working_call"]["before"]["successes"] == 0
    assert use["episodes_with_a_working_call"]["after"]["successes"] == 4
    assert use["failed_calls_per_episode"] == {"before": 0.25, "after": 0.25}
    assert use["turns_per_episode"] == {"before": 1.25, "after": 2.25}
    assert out["win_rate"]["on"] == "MathAnswerReward"
    assert out["win_rate"]["rate"] == pytest.approx((2 + 0.5 * 2) / 4)


def test_the_command_compares_two_policies_on_the_recipes_held_out_rows(eos_prone_model, tmp_path):
    """The shipped recipe's environment, reward and episode settings, its data's test split; the
    same policy twice gives identical episodes, so every difference is 0 and the win rate 1/2."""
    out = tmp_path / "results.json"
    main(["--config", str(REPO_ROOT / "configs" / "envs" / "arithmetic_calculator_grpo.yaml"),
          "--before", str(eos_prone_model), "--after", str(eos_prone_model), "--num_rows", "3", "--batch_size", "2",
          "--output", str(out)])
    result = json.loads(out.read_text())
    assert result["settings"]["max_turns"] == 3 and result["settings"]["num_rows_used"] == 3
    assert set(result["rewards"]) == {"MathAnswerReward", "environment"}
    assert result["rewards"]["MathAnswerReward"]["difference"]["mean_diff"] == 0
    assert result["win_rate"]["rate"] == 0.5
    assert len(result["samples"]) == 3
    assert all(s["before"] == s["after"] for s in result["samples"])
    assert all(s["row"]["reference"] for s in result["samples"])  # the test split's references reached the reward
