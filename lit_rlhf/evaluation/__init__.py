"""What judging a policy needs: evaluation prompts, the policy's completions, pairwise judging
and its statistics, tables and figures. `callbacks.JudgeEvalCallback` (during training) and
`python -m lit_rlhf.apps.judge_policy` (a saved policy) both use it. For verifiable tasks,
`pass_at_k` (pass@k, avg@k, maj@k and their bootstrap intervals) and `verifiable` (n checked
samples per problem) serve `callbacks.PassAtKCallback` and `python -m lit_rlhf.apps.pass_at_k`;
`harness` writes such a task for lm-evaluation-harness (`python -m lit_rlhf.apps.lm_eval_task`).

Conventions (both use them):
- the policy is completion **a**, the baseline completion **b**: `win_rate` is the policy's win
  rate over the baseline, ties count half, invalid verdicts are excluded from it and counted in
  `invalid_rate` (see `lit_rlhf.judges.stats`), with a 95% Wilson interval;
- lengths are in **tokens of the policy's tokenizer** (the completion text re-encoded without
  special tokens, so EOS is not counted); `length_ratio` is mean policy length / mean baseline
  length, and the figure buckets the per-item log(len_policy / len_baseline) (N+ Figure 8);
- evaluation prompts are the first `num_prompts` distinct prompts of a split, in dataset order,
  so every evaluation of a run sees the same prompts.
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
