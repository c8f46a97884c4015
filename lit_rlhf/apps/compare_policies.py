"""Did training make the policy better? Two policies on the same held-out prompts, paired
(described with its results in docs/getting-started.md and docs/guides/evaluation.md).

    python -m lit_rlhf.apps.compare_policies \\
        --before smollm2-135m-instruct --after outputs/quickstart/policy \\
        --prompts bundled:keyfact_sft --split test --num_prompts 64 \\
        --reward_model outputs/quickstart/reward_model \\
        --pairs bundled:keyfact_comparisons --pairs_split test \\
        --gold keyfact --output outputs/quickstart/results.json

Greedy completions (D23), reported with 95% intervals (`lit_rlhf.evaluation.paired`): `reward`
(read as the online modules do, D12; `--missing_eos_score` without EOS), `ended`, `gold` and
`gold_win_rate` (`lit_rlhf.judges.keyfact`), `reward_model` on held-out `--pairs`; with
`--checks`, `answers` and `differences` over every measure of `lit_rlhf.evaluation.golds` beside
the trivial `--baselines`. `--rescore <result.json ...>` rescores saved answers, pooling seeds by
a hierarchical bootstrap. Choose settings on `--split validation_sft`; the test posts only
report. `--output` gets the settings, date, machine, summary and one row per prompt.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from lit_rlhf.apps import import_class, machine, run_record  # noqa: F401 (scripts import machine from here)
from lit_rlhf.evaluation.golds import (
    EXTRACTIVE, MEASURES, checks_for, extractive_answers, load_checks, pool, score_answers
)
from lit_rlhf.evaluation.paired import paired_difference, paired_win_rate, proportion
from lit_rlhf.generation import SamplingConfig

GOLDS = ("keyfact",)


def complete(model: torch.nn.Module, tokenizer: Any, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int,
             batch_size: int) -> tuple[list[str], list[list[int]]]:
    """Greedy completions: (texts without EOS, response token ids with the EOS when sampled)."""
    from lit_rlhf.evaluation import generate_completions

    sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=1.0, do_sample=False)
    ids: list[list[int]] = []
    texts = generate_completions(model, tokenizer, prompt_ids, sampling, batch_size, response_ids=ids)
    return texts, ids


@torch.no_grad()
def reward_scores(reward_model: torch.nn.Module, pad_token_id: int, prompt_ids: Sequence[Sequence[int]],
                  *completion_ids: Sequence[Sequence[int]], batch_size: int = 16) -> list[list[float]]:
    """The reward of each prompt + completion, one list per completion set, read at the last real
    token (D12) of rows laid out as the online modules score rollouts: the prompt left padded, the
    completion after it (D5, D14). The completions of one prompt are scored together, each prompt
    computed once (`lit_rlhf.models.shared_prompt`; the same scores)."""
    from lit_rlhf.data.collate import pad_left, pad_right
    from lit_rlhf.rewards.sources import reward_model_scores

    k = len(completion_ids)
    per_batch = max(1, batch_size // k)  # prompts per forward: their k rows stay together
    out: list[list[float]] = [[] for _ in range(k)]
    for start in range(0, len(prompt_ids), per_batch):
        prompts = [list(p) for p in prompt_ids[start : start + per_batch] for _ in range(k)]
        completions = [list(c[i]) for i in range(start, min(start + per_batch, len(prompt_ids))) for c in completion_ids]
        p_ids, p_mask = pad_left(prompts, pad_token_id)
        c_ids, c_mask = pad_right(completions, pad_token_id)
        groups = torch.arange(len(prompts)) // k if k > 1 else None
        scores = reward_model_scores(reward_model, torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1),
                                     groups=groups, prompt_width=p_ids.shape[1]).tolist()
        for j in range(k):
            out[j].extend(scores[j::k])
    return out


PAIR_GOLDS = ("none", "note", "scores")


def heldout_pairs(reward_model: torch.nn.Module, tokenizer: Any, path: str, split: str, batch_size: int,
                  data_class: str = "lit_rlhf.data.TLDRPreferenceDataModule", gold: str = "note") -> dict[str, Any]:
    """The reward model's accuracy on held-out pairs, and its agreement with the gold label of each pair.

    The gold of a pair's two answers (`gold`): "note", the summaries' `note` fields ("gold=<score>",
    the TL;DR comparisons schema of the bundled `keyfact_comparisons`); "scores", the rows'
    `score_chosen` / `score_rejected` (the binarized chat schema of the bundled `keyfact_chat`,
    where they hold the gold); "none"."""
    if gold not in PAIR_GOLDS:
        raise ValueError(f"gold must be one of {PAIR_GOLDS}, got {gold!r}")
    dm = import_class(data_class)(path=path, tokenizer=tokenizer, train_split=None, val_split=split)
    ds = dm.dataset("val")
    prompts = [list(map(int, p)) for p in ds["_prompt_ids"]]
    chosen, rejected = reward_scores(reward_model, tokenizer.pad_token_id, prompts, ds["_chosen_ids"],
                                     ds["_rejected_ids"], batch_size=batch_size)
    correct = [float(c > r) for c, r in zip(chosen, rejected)]
    out: dict[str, Any] = {"path": path, "split": split, "accuracy": proportion(sum(correct), len(correct)).as_dict()}
    golds = None if gold == "none" else gold_of_pairs(dm.source.load(dm.splits["val"]), gold)
    if golds is not None:
        agree = [c > r for (c, r), (gc, gr) in zip(zip(chosen, rejected), golds) if gc != gr]
        wins = [gc > gr for gc, gr in golds if gc != gr]
        out["agreement_with_gold"] = proportion(sum(a == w for a, w in zip(agree, wins)), len(wins)).as_dict()
        out["labels_agreeing_with_gold"] = proportion(sum(wins), len(wins)).as_dict()
    return out


def gold_of_pairs(rows: Any, gold: str) -> list[tuple[float, float]]:
    """(gold of chosen, gold of rejected) per raw row, read as `gold` says (see `heldout_pairs`)."""
    out = []
    for i, row in enumerate(rows):
        if gold == "scores":
            out.append((float(row["score_chosen"]), float(row["score_rejected"])))
            continue
        notes = [str(s.get("note") or "") for s in row["summaries"]]
        if not all(n.startswith("gold=") for n in notes):
            raise ValueError(f"pair {i} has no 'gold=<score>' note on both summaries: {notes}")
        golds = [float(n[5:]) for n in notes]
        out.append((golds[row["choice"]], golds[1 - row["choice"]]))
    return out


def recipe_split(data: dict[str, Any], tokenizer: Any, split: str) -> Any:
    """Split `split` of a recipe's DataModule (`data`: its {class_path, init_args}), formatted as
    in training, the recipe's own splits left out."""
    args = {k: v for k, v in dict(data.get("init_args") or {}).items()
            if k not in ("tokenizer", "train_split", "val_split", "test_split")}
    dm = import_class(data["class_path"])(**args, tokenizer=tokenizer, train_split=None, val_split=None,
                                          test_split=split)
    return dm.dataset("test")


def objective(scores: Sequence[float], response_ids: Sequence[Sequence[int]], eos_token_id: int,
              missing_eos_score: float | None) -> list[float]:
    """The reward as the online step optimised it: the reward model's score, replaced by
    `missing_eos_score` for a response without EOS when training used the EOS trick (D23)."""
    if missing_eos_score is None:
        return list(scores)
    return [s if eos_token_id in ids else missing_eos_score for s, ids in zip(scores, response_ids)]


def plain_text(text: str, tokenizer: Any) -> str:
    """`text` without the tokenizer's special tokens ("<|im_end|>"), stripped."""
    for token in getattr(tokenizer, "all_special_tokens", []):
        text = text.replace(token, "")
    return text.strip()


def baseline_names(text: str) -> list[str]:
    """`--baselines`: comma-separated names of `lit_rlhf.evaluation.golds.EXTRACTIVE`."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in EXTRACTIVE]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown baselines {unknown}: choose from {', '.join(EXTRACTIVE)}")
    return names


def rescore(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    """The golds of the answers saved in `args.rescore` (results of this app or of
    `scripts/quickstart_report.py`), with `args.baselines`, pooled over the files (see the module
    docstring). The files must hold the same prompts in the same order."""
    results = []
    for path in args.rescore:
        result = json.loads(Path(path).read_text())
        if not result.get("samples"):
            raise ValueError(f"{path} holds no per-prompt samples to rescore")
        results.append(result)
    references = [s["reference"] for s in results[0]["samples"]]
    for path, result in zip(args.rescore, results):
        if [s["reference"] for s in result["samples"]] != references:
            raise ValueError(f"{path} scores other prompts than {args.rescore[0]}: seeds of one run share them")
    rows = checks_for(references, load_checks(args.checks)) if args.checks else None
    extra = extractive_answers(args.baselines, rows) if args.baselines else {}
    per_seed = []
    for result in results:
        scores = {"start": score_answers([s["before"] for s in result["samples"]], references, rows),
                  "trained": score_answers([s["after"] for s in result["samples"]], references, rows)}
        scores.update({name: score_answers(texts, references, rows) for name, texts in extra.items()})
        per_seed.append(scores)
    out: dict[str, Any] = {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": [Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])],
        "settings": vars(args),
        "inputs": [{"file": path, "seed": r.get("seed"), "created": r.get("created"), "n": len(r["samples"]),
                    **{k: (r.get("evaluation") or r.get("settings") or {}).get(k) for k in ("prompts", "split")}}
                   for path, r in zip(args.rescore, results)],
        "measures": {m: MEASURES[m] for m in per_seed[0]["start"]},
        "per_seed": [{a: {m: sum(v) / len(v) for m, v in ms.items()} for a, ms in seed.items()} for seed in per_seed],
        **pool(per_seed, against=["start", *args.baselines]),
        "per_prompt": per_seed,
    }
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k not in ("per_prompt", "settings")}, indent=1))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="the starting policy: model name, exported dir or .ckpt")
    parser.add_argument("--after", help="the trained policy, like --before")
    parser.add_argument("--prompts", help="data path of the prompts (bundled:<name>, a file, a hub id)")
    parser.add_argument("--data_class", default="lit_rlhf.data.TLDRPromptDataModule")
    parser.add_argument("--split", default="test")
    parser.add_argument("--num_prompts", type=int, default=64)
    parser.add_argument("--reward_model", help="the reward model the policy optimised")
    parser.add_argument("--gold", choices=GOLDS, default="keyfact", help="the independent gold measure")
    parser.add_argument("--pairs", default=None, help="held-out preference pairs for the reward model's accuracy")
    parser.add_argument("--pairs_split", default="test")
    parser.add_argument("--pairs_class", default="lit_rlhf.data.TLDRPreferenceDataModule")
    parser.add_argument("--pairs_gold", choices=PAIR_GOLDS, default="note",
                        help="where each held-out pair's gold is read (see heldout_pairs)")
    parser.add_argument("--missing_eos_score", type=float, default=None,
                        help="the EOS trick's constant (D23) when training used it: the optimised reward of a "
                             "response without EOS")
    parser.add_argument("--max_new_tokens", type=int, default=24)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--checks", default=None,
                        help="the posts' checks (bundled:keyfact_checks): distractors, listed false statements, and "
                             "the title and post the baselines copy")
    parser.add_argument("--baselines", type=baseline_names, default=[],
                        help=f"trivial answers scored beside the policies, comma-separated, of {', '.join(EXTRACTIVE)} "
                             "(needs --checks)")
    parser.add_argument("--rescore", nargs="+", default=None, metavar="RESULT",
                        help="rescore the answers saved in these result files (seeds of one run) instead of "
                             "generating; pooled over them")
    parser.add_argument("--output", default=None, help="write the JSON result here")
    args = parser.parse_args(argv)
    if args.baselines and not args.checks:
        parser.error("--baselines needs --checks (the title and post they copy)")
    if args.rescore:
        return rescore(args, argv)
    missing = [f"--{k}" for k in ("before", "after", "prompts", "reward_model") if not getattr(args, k)]
    if missing:
        parser.error(f"the following arguments are required without --rescore: {', '.join(missing)}")

    from lit_rlhf.apps.judge_policy import load_policy, load_prompts
    from lit_rlhf.judges.keyfact import KeyFactJudge
    from lit_rlhf.rewards.sources import load_reward_model

    started = datetime.datetime.now(datetime.timezone.utc)
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        timings[name] = round(time.perf_counter() - clock, 1)
        clock = time.perf_counter()

    completions: dict[str, tuple[list[str], list[list[int]]]] = {}
    prompts = None
    for role in ("before", "after"):
        model, tokenizer = load_policy(getattr(args, role))
        if prompts is None:
            prompts = load_prompts(args.prompts, tokenizer, args.data_class, args.split, args.num_prompts)
        lap(f"load_{role}")
        completions[role] = complete(model, tokenizer, prompts.prompt_ids, args.max_new_tokens, args.batch_size)
        lap(f"generate_{role}")
        del model
    reward_model = load_reward_model(args.reward_model, tokenizer).eval()
    lap("load_reward_model")
    raw = dict(zip(completions, reward_scores(reward_model, tokenizer.pad_token_id, prompts.prompt_ids,
                                              *(ids for _, ids in completions.values()), batch_size=args.batch_size)))
    rewards = {role: objective(raw[role], completions[role][1], tokenizer.eos_token_id, args.missing_eos_score)
               for role in completions}
    ended = {role: [float(tokenizer.eos_token_id in ids) for ids in completions[role][1]] for role in completions}
    lap("score")
    gold = KeyFactJudge(prompts.require_references())
    golds = {role: gold.scores(texts) for role, (texts, _) in completions.items()}
    result: dict[str, Any] = {
        **run_record(started, argv),
        "settings": vars(args),
        "reward": paired_difference(rewards["before"], rewards["after"]).as_dict(),
        "gold": paired_difference(golds["before"], golds["after"]).as_dict(),
        "gold_win_rate": paired_win_rate(golds["before"], golds["after"]).as_dict(),
        "ended": {role: proportion(sum(v), len(v)).as_dict() for role, v in ended.items()},
    }
    if args.pairs:
        result["reward_model"] = heldout_pairs(reward_model, tokenizer, args.pairs, args.pairs_split, args.batch_size,
                                               args.pairs_class, args.pairs_gold)
        lap("heldout_pairs")
    if args.checks:
        # a chat template may leave its end-of-turn marker on the reference (the tiny test tokenizer's does)
        references = [plain_text(r, tokenizer) for r in prompts.require_references()]
        rows = checks_for(references, load_checks(args.checks))
        extra = extractive_answers(args.baselines, rows)
        extra_ids = [[tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id] for t in texts]
                     for texts in extra.values()]
        extra_rewards = reward_scores(reward_model, tokenizer.pad_token_id, prompts.prompt_ids, *extra_ids,
                                      batch_size=args.batch_size) if extra else []
        scores = {"start": {**score_answers(completions["before"][0], references, rows), "reward": rewards["before"]},
                  "trained": {**score_answers(completions["after"][0], references, rows), "reward": rewards["after"]}}
        for (name, texts), reward in zip(extra.items(), extra_rewards):
            scores[name] = {**score_answers(texts, references, rows), "reward": reward}
        result.update(pool([scores], against=["start", *args.baselines]))
        result["per_prompt"] = scores
        lap("golds")
    result["timings"] = timings
    result["samples"] = [
        {"prompt": p, "reference": ref, "before": completions["before"][0][i], "after": completions["after"][0][i],
         "reward_before": rewards["before"][i], "reward_after": rewards["after"][i],
         "gold_before": golds["before"][i], "gold_after": golds["after"][i],
         "ended_before": bool(ended["before"][i]), "ended_after": bool(ended["after"][i])}
        for i, (p, ref) in enumerate(zip(prompts.prompts, prompts.references))
    ]
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary, indent=1))
    return result


if __name__ == "__main__":
    from lit_rlhf.apps import run

    run(main)
