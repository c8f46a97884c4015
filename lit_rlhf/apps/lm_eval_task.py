"""A policy on a local verifiable task through lm-evaluation-harness (`pip install lm-eval`).

    python -m lit_rlhf.apps.lm_eval_task --policy outputs/verifiable_math/policy \\
        --data bundled:arithmetic --split test --limit 60 --output_dir outputs/lm_eval

The policy is exported to `<output_dir>/policy` (a `.ckpt` through `lit_rlhf.export`, a model name
saved, an exported directory as is); `evaluation.harness.write_task` writes `<output_dir>/tasks/`
from local files (`--data bundled:<alias>` and `--split`, or `--data_files`); `lm_eval`'s `hf`
model runs on the export (the equivalent command is printed). `acc`, its standard error, the
configuration, versions and each document's generation go to `<output_dir>/results.json`.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from lit_rlhf.evaluation.harness import SCHEMAS, write_task


def export_policy(policy: str, out_dir: Path) -> Path:
    """An HF directory of `policy` (a `.ckpt`, an exported directory, or a model name)."""
    if Path(policy).is_dir() and (Path(policy) / "config.json").is_file():
        return Path(policy)
    if policy.endswith(".ckpt") or Path(policy).is_dir():
        from lit_rlhf.export import export_checkpoint

        return Path(export_checkpoint(policy, out_dir))
    from lit_rlhf.apps.judge_policy import load_policy

    model, tokenizer = load_policy(policy)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def data_files(data: str | None, split: str, files: list[str] | None) -> list[str]:
    """The task's local files: `--data_files`, or the bundled alias's split."""
    if files:
        return files
    from lit_rlhf.data.sources import BUNDLED_PREFIX, bundled_aliases

    if not data or not data.startswith(BUNDLED_PREFIX):
        raise ValueError(f"--data must be bundled:<alias> (or give --data_files), got {data!r}")
    alias = data[len(BUNDLED_PREFIX):]
    splits = bundled_aliases().get(alias)
    if not splits or split not in splits:
        raise ValueError(f"no bundled file {data} split {split!r} (bundled: {sorted(bundled_aliases())}; "
                         f"its splits: {sorted(splits or {})})")
    return [splits[split]]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", required=True, help="a .ckpt, an exported directory or a model name")
    parser.add_argument("--data", default="bundled:arithmetic", help="bundled:<alias> of question/answer rows")
    parser.add_argument("--split", default="test")
    parser.add_argument("--data_files", nargs="+", default=None, help="local JSON/JSONL files instead of --data")
    parser.add_argument("--schema", choices=sorted(SCHEMAS), default="gsm8k")
    parser.add_argument("--prompt_template", default="Question: {question}\nAnswer:")
    parser.add_argument("--task", default="lit_rlhf_qa", help="the task's name")
    parser.add_argument("--max_gen_toks", type=int, default=64)
    parser.add_argument("--limit", type=int, default=None, help="first documents only")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output_dir", required=True)
    args = parser.parse_args(argv)

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the task's data are local files
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(args.output_dir)
    tasks = write_task(out / "tasks", data_files(args.data, args.split, args.data_files), args.task, args.schema,
                       args.prompt_template, args.max_gen_toks)
    policy_dir = export_policy(args.policy, out / "policy")
    model_args = f"pretrained={policy_dir.resolve()},dtype=float32"
    command = (f"lm_eval --model hf --model_args {model_args} --include_path {tasks.resolve()} --tasks {args.task} "
               f"--device {args.device} --batch_size {args.batch_size}"
               + (f" --limit {args.limit}" if args.limit else ""))
    print(command)

    import lm_eval
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(model="hf", model_args=model_args, tasks=[args.task],
                                      task_manager=TaskManager(include_path=str(tasks)), limit=args.limit,
                                      device=args.device, batch_size=args.batch_size, log_samples=True)
    metrics = results["results"][args.task]
    summary = {"task": args.task, "policy": args.policy, "export": str(policy_dir), "command": command,
               "acc": metrics.get("acc,none"), "acc_stderr": metrics.get("acc_stderr,none"),
               "n": len(results["samples"][args.task]), "lm_eval": getattr(lm_eval, "__version__", None)}
    samples = [{"doc": s["doc"], "generation": s["filtered_resps"][0], "acc": s["acc"]}
               for s in results["samples"][args.task]]
    (out / "results.json").write_text(json.dumps({**summary, "config": results.get("config"), "samples": samples},
                                                 indent=1, default=str) + "\n")
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    from lit_rlhf.apps import run

    run(main)
