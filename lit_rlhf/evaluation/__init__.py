"""What judging a policy needs: evaluation prompts, the policy's completions, pairwise judging
and its statistics, tables and figures, for `callbacks.JudgeEvalCallback` and `python -m
lit_rlhf.apps.judge_policy`; for verifiable tasks `pass_at_k`, `verifiable` and `harness` (an
lm-evaluation-harness task) serve `callbacks.PassAtKCallback` and the `pass_at_k` and
`lm_eval_task` apps.

Conventions: the policy is completion **a**, the baseline **b**; `win_rate` is the policy's, ties
half, invalid verdicts excluded and counted in `invalid_rate` (`lit_rlhf.judges.stats`), with a
95% Wilson interval; lengths are in **tokens of the policy's tokenizer** without special tokens
(`length_ratio`: mean policy / mean baseline length; the figure buckets log(len_policy /
len_baseline), N+ Figure 8); the prompts are the first `num_prompts` distinct prompts of a split,
so every evaluation of a run sees the same ones.
"""

from lit_rlhf.evaluation.best_of_n import BestOfN, best_of_n
from lit_rlhf.evaluation.completions import GREEDY, generate_completions
from lit_rlhf.evaluation.judging import JudgeEvaluation, evaluate_completions, judge_metrics, judge_safely, token_length
from lit_rlhf.evaluation.prompts import EvalPrompts, encode_prompt_text, prompts_from_dataset, prompts_from_texts
from lit_rlhf.evaluation.reports import VERDICTS, examples_table, length_ratio_figure, markdown_cell

__all__ = [
    "BestOfN", "GREEDY", "best_of_n", "VERDICTS", "EvalPrompts", "JudgeEvaluation", "encode_prompt_text",
    "evaluate_completions", "examples_table", "generate_completions", "judge_metrics", "judge_safely",
    "length_ratio_figure", "markdown_cell", "prompts_from_dataset", "prompts_from_texts", "token_length"
]
