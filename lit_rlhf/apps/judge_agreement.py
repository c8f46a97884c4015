"""Does the reward model agree with an external judge? (The N+ paper's Detail 17, Huang et al. 2024.)

    python -m lit_rlhf.apps.judge_agreement \\
        --reward_model outputs/tldr/reward/hf_model \\
        --pairs openai/summarize_from_feedback --split validation --num_pairs 256 \\
        --judge judge.yaml                      # e.g. {class_path: lit_rlhf.judges.ChatAPIJudge, init_args: {...}}
        --output_dir outputs/tldr/reward/agreement

Both judge the held-out pairs (chosen as a, rejected as b): the reward model as a
`RewardModelJudge` (scored at the EOS, D3/D12), the judge as in `judge_policy`. `metrics.json`
(printed) holds `agreement`, `reward_model_accuracy` and `judge_accuracy` with 95% Wilson and
exact intervals; `pairs.jsonl` one row per pair (texts, rewards, verdicts, the raw reply).
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Sequence

import torch

from lit_rlhf.apps import import_class, write_results
from lit_rlhf.judges import Judgement, PairwiseJudge, RewardModelJudge, agreement


class ScalarModelReward:
    """reward_fn(prompts, completions) -> (N,) over a lit_rlhf scalar model (a reward model).

    A prompt is encoded as the data modules encode plain-text prompts (`encode_prompt`: the BOS
    the tokenizer adds, no EOS), a completion as text + EOS (`encode_completion`, D3), and each
    pair is scored at its last real token (the EOS, D12) with the prompt left padded, exactly as
    the online modules score rollouts (`lit_rlhf.apps.compare_policies.reward_scores`)."""

    def __init__(self, reward_model: torch.nn.Module, tokenizer: Any, batch_size: int = 16) -> None:
        self.reward_model, self.tokenizer, self.batch_size = reward_model, tokenizer, int(batch_size)

    def __call__(self, prompts: list[str], completions: list[str]) -> list[float]:
        from lit_rlhf.apps.compare_policies import reward_scores
        from lit_rlhf.data.formatting import encode_completion, encode_prompt

        prompt_ids = [encode_prompt(self.tokenizer, p) for p in prompts]
        completion_ids = [encode_completion(self.tokenizer, c) for c in completions]
        (scores,) = reward_scores(self.reward_model, self.tokenizer.pad_token_id, prompt_ids, completion_ids,
                                  batch_size=self.batch_size)
        return scores


def load_pairs(path: str, tokenizer: Any, data_class: str, split: str, num_pairs: int | None) -> dict[str, list[str]]:
    """The first `num_pairs` pairs of split `split` (prompt, chosen, rejected texts) of a
    `lit_rlhf.data` preference DataModule built on `path`."""
    dm = import_class(data_class)(path=path, tokenizer=tokenizer, train_split=None, val_split=split)
    ds = dm.dataset("val")
    n = len(ds) if num_pairs is None else min(num_pairs, len(ds))
    if n < 1:
        raise ValueError(f"{path} split {split!r} has no pairs")
    rows = ds.select(range(n))
    return {"prompt": list(rows["prompt"]), "chosen": list(rows["chosen"]), "rejected": list(rows["rejected"])}


def accuracy_against_label(judgements: Sequence[Judgement], label: str = "a") -> dict[str, Any]:
    """How often a judge picks the dataset's preferred completion (`label`), among the items where
    it names a winner, with its Wilson and Clopper-Pearson intervals."""
    decisive = [j for j in judgements if j.winner in ("a", "b")]
    return proportion_dict(sum(j.winner == label for j in decisive), len(decisive), undecided=len(judgements) - len(decisive))


def proportion_dict(successes: int, n: int, **extra: Any) -> dict[str, Any]:
    """successes / n with both 95% intervals (Wilson; exact Clopper-Pearson)."""
    from lit_rlhf.evaluation.paired import clopper_pearson_interval, proportion

    p = proportion(successes, n)
    exact = clopper_pearson_interval(successes, n)
    return {**p.as_dict(), "exact_low": exact[0], "exact_high": exact[1], **extra}


def measure_agreement(reward_judge: PairwiseJudge, judge: PairwiseJudge, pairs: dict[str, list[str]]) -> dict[str, Any]:
    """Both judges on every pair (chosen as a, rejected as b): the metrics and the per-pair rows."""
    prompts, chosen, rejected = pairs["prompt"], pairs["chosen"], pairs["rejected"]
    by_reward = reward_judge.judge(prompts, chosen, rejected)
    by_judge = judge.judge(prompts, chosen, rejected)
    stats = agreement(by_reward, by_judge)
    metrics = {
        "num_pairs": len(prompts),
        "agreement": {**proportion_dict(stats.agree, stats.num_decisive),
                      "reward_model_undecided": stats.undecided_x, "judge_undecided": stats.undecided_y},
        "reward_model_accuracy": accuracy_against_label(by_reward),
        "judge_accuracy": accuracy_against_label(by_judge),
    }
    rows = [{"prompt": p, "a": a, "b": b, "label": "a", "reward_model": r.winner, "reward_model_raw": r.raw,
             "judge": j.winner, "judge_raw": j.raw, "judge_swapped": j.swapped, "judge_error": j.error}
            for p, a, b, r, j in zip(prompts, chosen, rejected, by_reward, by_judge)]
    return {"metrics": metrics, "rows": rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reward_model", required=True, help="a RewardModule .ckpt, an exported dir, or a model name")
    parser.add_argument("--tokenizer", default=None, help="default: the reward model's")
    parser.add_argument("--pairs", required=True, help="preference pairs: bundled:<name>, a file, a hub id")
    parser.add_argument("--pairs_class", default="lit_rlhf.data.TLDRPreferenceDataModule")
    parser.add_argument("--split", default="validation")
    parser.add_argument("--num_pairs", type=int, default=256)
    parser.add_argument("--judge", required=True, help="YAML file {class_path, init_args} or a class path")
    parser.add_argument("--judge_args", default=None, help="init args of --judge as a JSON/YAML dict")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--output_dir", default=None, help="write metrics.json and pairs.jsonl here")
    args = parser.parse_args(argv)

    from lit_rlhf import models
    from lit_rlhf.apps.judge_policy import build_judge
    from lit_rlhf.rewards.sources import load_reward_model

    judge = build_judge(args.judge, args.judge_args)
    tokenizer = models.load_tokenizer(args.tokenizer or args.reward_model)
    reward_model = load_reward_model(args.reward_model, tokenizer).eval()
    pairs = load_pairs(args.pairs, tokenizer, args.pairs_class, args.split, args.num_pairs)
    result = measure_agreement(RewardModelJudge(ScalarModelReward(reward_model, tokenizer, args.batch_size)), judge, pairs)
    result["metrics"]["settings"] = vars(args)
    if args.output_dir:
        write_results(args.output_dir, result["metrics"], "pairs.jsonl", result["rows"])
    print(json.dumps(result["metrics"], indent=2))
    return result


if __name__ == "__main__":
    from lit_rlhf.apps import run

    run(main)
