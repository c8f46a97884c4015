"""Did training make the policy better at a multi-turn environment? Two policies on the same
held-out rows (docs/guides/environments.md).

    python -m lit_rlhf.apps.compare_env_policies \\
        --config configs/envs/arithmetic_calculator_grpo.yaml \\
        --before outputs/envs/arithmetic_calculator_coldstart/policy \\
        --after outputs/envs/arithmetic_calculator_grpo/policy \\
        --split test --num_rows 100 --output outputs/envs/arithmetic_calculator_grpo/results.json

The environment, rewards and episode settings come from the recipe's `model.init_args`, the rows
from its `data` with `--split` as the test split. One greedy episode per row and policy, paired,
with 95% intervals (`lit_rlhf.evaluation.paired`): each reward source before and after, their
difference and sign test (`rewards`), `tool_use` and the `win_rate` on the first reward. The JSON
result (`--output`) holds the settings, date, machine, summary and one row per problem.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from lit_rlhf.apps import run_record
from lit_rlhf.evaluation.paired import paired_difference, paired_win_rate, proportion, sign_test


def recipe_settings(config_path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the model's init_args with its `EnvironmentRollouts` settings, the data section) of a
    training recipe YAML, checked."""
    config = yaml.safe_load(Path(config_path).read_text())
    try:
        model, data = config["model"]["init_args"], config["data"]
    except (KeyError, TypeError) as err:
        raise ValueError(f"{config_path}: a recipe has model.init_args and data sections ({err} missing)") from err
    source = model.get("rollout") or {}
    episodes = source.get("init_args") or {} if isinstance(source, dict) else {}
    if not episodes.get("environment"):
        raise ValueError(f"{config_path}: model.init_args.rollout is not an EnvironmentRollouts with an environment: "
                         "this compares environment episodes (single-turn policies: python -m "
                         "lit_rlhf.apps.compare_policies)")
    return {**model, **episodes}, data  # the episode settings (environment, max_turns, ...) beside the model's


def instantiate(environment: Any, reward_fns: Any) -> tuple[Any, list[Callable]]:
    """The environment and reward functions from their YAML form, resolved as the CLI does."""
    from jsonargparse import ArgumentParser

    from lit_rlhf.envs.base import Environment

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--environment", type=Environment)
    parser.add_argument("--reward_fns", type=Optional[list[Callable]], default=None)
    config = parser.parse_object({"environment": environment, "reward_fns": reward_fns})
    build = getattr(parser, "instantiate", None) or parser.instantiate_classes  # jsonargparse >= 4.49: instantiate
    init = build(config)
    return init.environment, list(init.reward_fns or [])


def heldout_rows(data: dict[str, Any], tokenizer: Any, split: str, num_rows: int) -> list[dict[str, Any]]:
    """The first `num_rows` rows of `split` as the recipe's DataModule formats them (its columns,
    without the token ids)."""
    from lit_rlhf.apps.compare_policies import recipe_split

    ds = recipe_split(data, tokenizer, split)
    n = len(ds) if num_rows <= 0 else min(num_rows, len(ds))
    columns = [c for c in ds.column_names if not c.startswith("_")]
    return [{c: ds[i][c] for c in columns} for i in range(n)]


def summarise(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    """The paired figures of two policies' records on the same rows (see the module docstring)."""
    out: dict[str, Any] = {"rewards": {}}
    for name in before[0]["rewards"]:
        b = [r["rewards"][name] for r in before]
        a = [r["rewards"][name] for r in after]
        out["rewards"][name] = {"difference": paired_difference(b, a).as_dict(),
                                "sign_test": sign_test([y - x for x, y in zip(b, a)])._asdict()}
    sides = {"before": before, "after": after}
    used = {role: [float(r["tool_calls"] > r["tool_errors"]) for r in records] for role, records in sides.items()}
    errors = {role: [float(r["tool_errors"]) for r in records] for role, records in sides.items()}
    out["tool_use"] = {
        "episodes_with_a_working_call": {role: proportion(sum(v), len(v)).as_dict() for role, v in used.items()},
        "difference": paired_difference(used["before"], used["after"]).as_dict(),
        "failed_calls_per_episode": {role: sum(v) / len(v) for role, v in errors.items()},
        "failed_calls_difference": paired_difference(errors["before"], errors["after"]).as_dict(),
        "turns_per_episode": {role: sum(r["turns"] for r in records) / len(records) for role, records in sides.items()},
    }
    first = next(iter(before[0]["rewards"]))
    out["win_rate"] = {"on": first, **paired_win_rate([r["rewards"][first] for r in before],
                                                      [r["rewards"][first] for r in after]).as_dict()}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the training recipe (its environment, rewards and data)")
    parser.add_argument("--before", required=True, help="the starting policy: model name, exported dir or .ckpt")
    parser.add_argument("--after", required=True, help="the trained policy, like --before")
    parser.add_argument("--split", default="test", help="held-out split of the recipe's data")
    parser.add_argument("--num_rows", type=int, default=100, help="first rows of the split (0: all)")
    parser.add_argument("--batch_size", type=int, default=25, help="episodes run together")
    parser.add_argument("--output", default=None, help="write the JSON result here")
    args = parser.parse_args(argv)

    from lit_rlhf.evaluation.episodes import evaluate_episodes
    from lit_rlhf.apps.judge_policy import load_policy

    started = datetime.datetime.now(datetime.timezone.utc)
    model_args, data = recipe_settings(args.config)
    environment, reward_fns = instantiate(model_args["environment"], model_args.get("reward_fns"))
    episode = {"max_turns": int(model_args.get("max_turns", 1)),
               "max_episode_tokens": model_args.get("max_episode_tokens"),
               "max_new_tokens": int(model_args.get("max_new_tokens", 53))}
    records: dict[str, list[dict[str, Any]]] = {}
    timings: dict[str, float] = {}
    rows = None
    for role in ("before", "after"):
        clock = time.perf_counter()
        model, tokenizer = load_policy(getattr(args, role))
        if rows is None:
            rows = heldout_rows(data, tokenizer, args.split, args.num_rows)
        records[role] = evaluate_episodes(model, tokenizer, environment, rows, reward_fns,
                                          batch_size=args.batch_size, **episode)
        timings[role] = round(time.perf_counter() - clock, 1)
        del model
    environment.close()
    result: dict[str, Any] = {
        **run_record(started, argv),
        "settings": {**vars(args), **episode, "num_rows_used": len(rows)},
        **summarise(records["before"], records["after"]),
        "timings": timings,
        "samples": [{"row": rows[i], "before": records["before"][i], "after": records["after"][i]}
                    for i in range(len(rows))],
    }
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1, default=str))
    return result


if __name__ == "__main__":
    from lit_rlhf.apps import run

    run(main)
