"""Reward sources for online methods: reward models and Python callables.

A reward source turns sampled completions into one scalar each: a **reward model** (a
`ScalarHeadModel` read at the EOS token, D12, loaded by `load_reward_model`), or a **reward
function** `(prompts, completions, **batch_columns) -> N floats`, where the columns are the
PromptBatch's `meta` repeated to N rows plus `completion_length` (response tokens, EOS included)
and `truncated` (no EOS within `max_new_tokens`). In YAML a function is a dotted path and a
callable class `{class_path, init_args}`; one that raises stops the step with a
`RewardFunctionError` naming it and the row. `combine_rewards` weighs several sources
(`reward_weights`), optionally normalising each (`normalize_reward`).

Shipped functions: `MathAnswerReward` (`math-verify`), `FormatReward` and `OverlongPenalty`
(DAPO), `PairwiseJudgeReward` and `RubricReward` (judges as rewards), `KeyFactRecallReward`
(the key-fact gold), `CharacterFractionReward` and `ReferenceMatchReward` (small, for tests).
"""

from lit_rlhf.rewards.examples import CharacterFractionReward, ReferenceMatchReward
from lit_rlhf.rewards.gold import KeyFactRecallReward
from lit_rlhf.rewards.judge import PairwiseJudgeReward
from lit_rlhf.rewards.rubric import RubricReward
from lit_rlhf.rewards.math_answer import MathAnswerReward, answer_keys, answers_match, final_answer_text, parse_answer
from lit_rlhf.rewards.shaping import FormatReward, OverlongPenalty
from lit_rlhf.rewards.sources import (
    RewardFn, RewardFunctionError, RewardNormalization, call_reward_fn, combine_rewards, function_name,
    load_reward_model, normalize_reward, reward_model_scores
)

__all__ = [
    "CharacterFractionReward", "FormatReward", "KeyFactRecallReward", "MathAnswerReward", "OverlongPenalty",
    "PairwiseJudgeReward", "ReferenceMatchReward", "RewardFn", "RewardFunctionError", "RewardNormalization",
    "RubricReward", "answer_keys", "answers_match", "call_reward_fn", "combine_rewards", "final_answer_text",
    "function_name", "load_reward_model", "normalize_reward", "parse_answer", "reward_model_scores"
]
