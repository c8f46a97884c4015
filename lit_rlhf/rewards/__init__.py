"""Reward sources for online methods (PPO, GRPO): reward models and Python callables.

A reward source is anything that turns sampled completions into one scalar each:

- a **reward model**: a `ScalarHeadModel` read at the EOS token of prompt+response, i.e. the
  last real token of the row (D12; D14 makes the left-padded prompt harmless). It is loaded
  from a `RewardModule` checkpoint or an exported `AutoModelForSequenceClassification`
  directory by `load_reward_model` (see `lit_rlhf.models`);
- a **reward function**: any callable `(prompts, completions, **batch_columns) -> rewards`,
  where `prompts` and `completions` are lists of N strings (completions without EOS and
  padding), `batch_columns` are the PromptBatch's `meta` columns repeated to N rows (for
  instance `reference` for a verifiable answer) plus `completion_length` (response tokens,
  EOS included) and `truncated` (no EOS within `max_new_tokens`), and `rewards` is a sequence
  or tensor of N floats. In a YAML config a function is a dotted path
  (`my_pkg.rewards.exact_match`) and a callable class is `{class_path: ..., init_args: {...}}`.
  A function that raises stops the step with a `RewardFunctionError` naming it and the row.

`combine_rewards` weighs several sources (`reward_weights`, default 1 each) into the score of
each response, optionally normalising each source first (`normalize_reward`).

Modules:
- `sources`: the reward model, calling and checking functions, combining sources;
- `math_answer`: `MathAnswerReward`, a math answer checker on `math-verify` (GSM8K `####`,
  `\\boxed{}`, LaTeX, equivalent forms);
- `shaping`: `FormatReward` (regex / tag structure) and `OverlongPenalty` (DAPO's soft overlong
  punishment);
- `judge`: `PairwiseJudgeReward`, a pairwise judge (`lit_rlhf.judges`: local LM, chat API,
  reward model) as a reward: each sample's win rate against its prompt's other samples;
- `rubric`: `RubricReward`, a pointwise rubric judge (`lit_rlhf.judges.RubricJudge`: weighted
  criteria, each scored by an LLM judge, aggregated by mean, min or all-pass) as a reward;
- `gold`: `KeyFactRecallReward`, the key-fact gold (`lit_rlhf.judges.keyfact`) as a reward: the
  positive control of a synthetic-gold experiment, or (weight 0) the gold logged beside the proxy;
- `examples`: `CharacterFractionReward`, `ReferenceMatchReward` (small, for tests).
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
