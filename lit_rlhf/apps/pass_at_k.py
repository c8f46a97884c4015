"""avg@k, pass@k and maj@k of one or two policies on held-out problems of a verifiable task.

    python -m lit_rlhf.apps.pass_at_k --config examples/verifiable_math.yaml \\
        --before smollm2-135m-instruct --after outputs/verifiable_math/policy \\
        --split "test[:60]" --n 8 --k 1 4 8 --temperature 1.0 --max_new_tokens 16 \\
        --output outputs/verifiable_math/pass_at_k.json

The problems: the first `--num_problems` distinct prompts of `--split` of the recipe's `data`,
formatted as in training. Each policy samples `--n` checked completions per problem (same
settings and seed for both; `lit_rlhf.evaluation.verifiable`); printed per `--k` with 95%
bootstrap intervals (`lit_rlhf.evaluation.pass_at_k`), with `--after` the paired difference and
its verdict. `--output` gets the settings, date, machine, summary and one row per problem.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path
from typing import Any

import yaml

from lit_rlhf.apps import run_record
from lit_rlhf.evaluation.pass_at_k import compare, metric_names, summarise


def recipe_data(config_path: str) -> dict[str, Any]:
    """The `data` section ({class_path, init_args}) of a training recipe YAML, checked."""
    config = yaml.safe_load(Path(config_path).read_text()) or {}
    data = config.get("data") if isinstance(config, dict) else None
    if not isinstance(data, dict) or "class_path" not in data:
        raise ValueError(f"{config_path}: a recipe has a data section with a class_path (a QADataModule)")
    return data


def heldout_problems(data: dict[str, Any], tokenizer: Any, split: str, num_problems: int) -> Any:
    """`EvalPrompts` of the first `num_problems` distinct prompts of `split` (0: all), formatted
    by the recipe's DataModule, references required."""
    from lit_rlhf.apps.compare_policies import recipe_split
    from lit_rlhf.evaluation import prompts_from_dataset

    prompts = prompts_from_dataset(recipe_split(data, tokenizer, split), num_problems or None, "reference", tokenizer)
    prompts.require_references()
    return prompts


def table(summary: dict[str, Any], difference: dict[str, Any] | None) -> str:
    """The printed table: one line per metric."""
    def cell(s: dict[str, Any], sign: str = "") -> str:  # sign "+": a difference
        return f"{s['mean']:{sign}.3f} [{s['ci_low']:{sign}.3f}, {s['ci_high']:{sign}.3f}]"

    roles = list(summary)
    head = ["metric", *roles] + (["after - before (95% interval)", "verdict"] if difference else [])
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for name in summary[roles[0]]:
        row = [name, *(cell(summary[r][name]) for r in roles)]
        if difference:
            row += [cell(difference[name], "+"), difference[name]["verdict"]]
        lines.append(" | ".join(row))
    return "\n".join(lines)


def sample_policies(args: argparse.Namespace, data: dict[str, Any], sampling: Any) -> tuple[dict, dict, Any]:
    """({role: SampledAnswers}, {role: seconds}, the problems) of `--before` (and `--after`), each
    loaded in turn and sampled with the same settings and seed."""
    from lit_rlhf.apps.judge_policy import load_policy
    from lit_rlhf.evaluation.verifiable import sample_answers

    roles = {"before": args.before, **({"after": args.after} if args.after else {})}
    results, timings, prompts = {}, {}, None
    for role, name in roles.items():
        clock = time.perf_counter()
        model, tokenizer = load_policy(name)
        if prompts is None:
            prompts = heldout_problems(data, tokenizer, args.split, args.num_problems)
        results[role] = sample_answers(model, tokenizer, prompts, args.n, args.k, sampling, args.batch_size, args.seed)
        timings[role] = round(time.perf_counter() - clock, 1)
        del model
    return results, timings, prompts


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the training recipe (its data section gives the problems)")
    parser.add_argument("--before", required=True, help="a policy: model name, exported dir or .ckpt")
    parser.add_argument("--after", default=None, help="a second policy, compared with --before problem by problem")
    parser.add_argument("--split", default="test", help="held-out split of the recipe's data (slices allowed)")
    parser.add_argument("--data_args", default=None,
                        help="init args overriding the recipe's data section, as a JSON/YAML dict")
    parser.add_argument("--num_problems", type=int, default=60, help="first distinct problems of the split (0: all)")
    parser.add_argument("--n", type=int, default=8, help="samples per problem")
    parser.add_argument("--k", type=int, nargs="+", default=[1, 4, 8], help="the k of avg@k, pass@k, maj@k")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top_p", type=float, default=1.0)
    parser.add_argument("--top_k", type=int, default=0)
    parser.add_argument("--max_new_tokens", type=int, default=None, help="default: the recipe's, else 64")
    parser.add_argument("--seed", type=int, default=0, help="the sampling seed (the same for both policies)")
    parser.add_argument("--batch_size", type=int, default=16, help="rows sampled together")
    parser.add_argument("--num_resamples", type=int, default=10000, help="bootstrap resamples")
    parser.add_argument("--output", default=None, help="write the JSON result here")
    args = parser.parse_args(argv)
    if any(k < 1 for k in args.k) or max(args.k) > args.n:
        parser.error(f"every --k must be in 1..--n ({args.n}), got {args.k}")

    from lit_rlhf.generation import SamplingConfig

    started = datetime.datetime.now(datetime.timezone.utc)
    data = recipe_data(args.config)
    overrides = yaml.safe_load(args.data_args) if args.data_args else {}
    if not isinstance(overrides, dict):
        parser.error(f"--data_args must be a dict, got {args.data_args!r}")
    data = {**data, "init_args": {**(data.get("init_args") or {}), **overrides}}
    recipe_model = (yaml.safe_load(Path(args.config).read_text()).get("model") or {}).get("init_args") or {}
    max_new_tokens = args.max_new_tokens or int(recipe_model.get("max_new_tokens", 64))
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p, do_sample=True)
    results, timings, prompts = sample_policies(args, data, sampling)
    summary = {role: summarise(r.values, args.num_resamples) for role, r in results.items()}
    difference = compare(results["before"].values, results["after"].values, args.num_resamples) \
        if "after" in results else None
    records = {role: r.records(prompts) for role, r in results.items()}
    result: dict[str, Any] = {
        **run_record(started, argv),
        "settings": {**vars(args), "num_problems_used": len(prompts), "sampling": vars(sampling)},
        "metrics": metric_names(args.k),
        "summary": summary,
        "difference": difference,
        "timings": timings,
        "problems": [{"prompt": prompts.prompts[i], "reference": prompts.references[i],
                      **{role: {k: v for k, v in records[role][i].items() if k not in ("prompt", "reference")}
                         for role in records}} for i in range(len(prompts))],
    }
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(prompts)} problems, {args.n} samples each ({json.dumps(vars(sampling))}, seed {args.seed})")
    print(table(summary, difference))
    return result


if __name__ == "__main__":
    from lit_rlhf.apps import run

    run(main)
