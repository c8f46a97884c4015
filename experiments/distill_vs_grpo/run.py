"""Distillation from a GRPO-trained teacher against GRPO itself, same start, same student samples.

    python -m experiments.distill_vs_grpo.run --out experiments/distill_vs_grpo/results

Arms (same start SmolLM2-135M-Instruct, the same training questions in the same order, 6
questions x 4 sampled answers of up to 16 tokens per step, `--steps` steps, 24 student samples
each):

- `grpo`: examples/verifiable_math.yaml as shipped (GRPO, the math-verify reward, lr 2e-5);
- `distill`: experiments/distill_vs_grpo/distill.yaml (DistillationModule, reverse_kl_pg, the
  teacher the GRPO policy that examples/verifiable_math.py exported, seed 1), at `--distill-lr`
  (default grpo's), or with `--distill-lr 0` at the lr chosen on validation (stage 2).

Stages, each skipped where its file exists (so an interrupted run resumes where it stopped):

1. `teacher.json`, `start_test.json`, `start_val.json`: the teacher's and the start's greedy
   answers on the evaluation and the validation split (`--only policies`; `--test-only`: the
   teacher on the evaluation split alone);
2. with `--distill-lr 0` (or `--only select`, alone): `select/distill_lr*.json`, arm `distill`
   at each lr of `--lrs` with `--selection-seed`, evaluated on the validation split for
   `--select-steps` steps (8: checkpoints 4 and 8); `select/choice.json`: the lr with the highest
   mean validation greedy accuracy over the checkpoints after step 0 (ties: the smaller lr);
3. `runs/{arm}_s{seed}.json`: each reported seed, `grpo` then `distill` (`--only ARM --seed S`:
   one run alone), evaluated on the evaluation split (`--eval-split`, default `test[:60]`).

Every run file holds, at each checkpoint (steps 0, `--every`, ...), each problem's greedy answer
and whether math-verify matches it to the reference (`lit_rlhf.rewards.answers_match`), the
number of student samples drawn so far, the training scores per step and the wall time.
`python -m experiments.distill_vs_grpo.reading <out>` reads them.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from lit_rlhf.cli import main as cli_main
from lit_rlhf.generation import SamplingConfig, decode_responses, generate_responses
from lit_rlhf.rewards import answers_match

HERE = Path(__file__).resolve().parent
ARMS = {"grpo": "examples/verifiable_math.yaml", "distill": str((HERE / "distill.yaml").relative_to(HERE.parent.parent))}
SHIPPED_GRPO_LR = 2e-5


def machine() -> dict[str, Any]:
    from lit_rlhf.apps.compare_policies import machine as _machine

    return _machine()


@torch.no_grad()
def greedy_answers(module, datamodule, role: str, max_new_tokens: int) -> dict[str, list]:
    """Each problem's greedy answer on a split, whether it matches the reference, and the
    reference; the global random state is left as it was (training draws are unchanged)."""
    config = SamplingConfig(max_new_tokens=max_new_tokens, temperature=1.0, do_sample=False)
    tokenizer = module.tokenizer
    answers, correct, references = [], [], []
    with torch.random.fork_rng(devices=[]):
        for batch in datamodule._loader(role, shuffle=False):
            batch = batch.to(module.device)
            ids, mask, _ = generate_responses(module.policy, batch.input_ids, batch.attention_mask.bool(), config,
                                              tokenizer.eos_token_id, tokenizer.pad_token_id)
            texts = decode_responses(tokenizer, ids, mask)
            answers += texts
            references += list(batch.meta["reference"])
            correct += [bool(answers_match(ref, text)) for ref, text in zip(batch.meta["reference"], texts)]
    return {"correct": correct, "answers": answers, "references": references}


class CheckpointEval(Callback):
    """Greedy answers on `role` after every `every` optimizer steps (step 0 is taken before fit)."""

    def __init__(self, datamodule, role: str, every: int, max_new_tokens: int, record: dict) -> None:
        self.datamodule, self.role, self.every, self.max_new_tokens, self.record = (
            datamodule, role, every, max_new_tokens, record)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.every == 0 and str(step) not in self.record:
            was_training = pl_module.training
            pl_module.eval()
            self.record[str(step)] = {**greedy_answers(pl_module, self.datamodule, self.role, self.max_new_tokens),
                                      "samples": int(pl_module.episodes)}
            pl_module.train(was_training)


def build(arm: str, seed: int, lr: float, steps: int, eval_split: str, log_dir: Path, model: str | None,
          teacher: str | None, extra: list[str]):
    args = ["--config", ARMS[arm], f"--seed_everything={seed}", f"--model.init_args.lr={lr}",
            f"--model.init_args.total_episodes={steps * 24}", f"--data.init_args.test_split={eval_split}",
            "--data.init_args.eval_batch_size=50", f"--trainer.logger.init_args.save_dir={log_dir}",
            f"--trainer.logger.init_args.name={arm}_s{seed}_lr{lr:g}", "--trainer.enable_progress_bar=false",
            "--model.init_args.export_dir=null"]  # never over the teacher (the example's export_dir)
    if model:
        args.append(f"--model.init_args.model={model}")
    if teacher and arm == "distill":
        args.append(f"--model.init_args.teacher={teacher}")
    return cli_main(args + list(extra), run=False)


def train_scores(log_dir: Path) -> list[float]:
    paths = list(log_dir.rglob("metrics.csv"))
    rows = list(csv.DictReader(paths[0].open())) if paths else []
    return [float(r["train/objective/scores"]) for r in rows if r.get("train/objective/scores")]


def run_arm(arm: str, seed: int, lr: float, role: str, path: Path, opts: argparse.Namespace,
            steps: int | None = None) -> dict:
    """Train one arm for one seed (`steps`, default `--steps`), evaluating `role` at each
    checkpoint; write and return its record."""
    if path.exists():
        return json.loads(path.read_text())
    started = time.time()
    log_dir = Path(opts.logs)
    cli = build(arm, seed, lr, steps or opts.steps, opts.eval_split, log_dir, opts.model, opts.teacher, opts.extra)
    module, datamodule, trainer = cli.model, cli.datamodule, cli.trainer
    datamodule.setup("fit")
    datamodule.setup("test")
    max_new = module.sampling.max_new_tokens
    # step 0 is the start's greedy answers, the same for every arm and seed: computed once
    # (`--only policies`, `start_{role}.json`) and read from there, or computed here without that file
    start_path = path.parent.parent / f"start_{role}.json"
    if start_path.exists():
        start = json.loads(start_path.read_text())["answers"]
    else:
        start = greedy_answers(module, datamodule, role, max_new)
    checkpoints: dict[str, Any] = {"0": {**start, "samples": 0}}
    trainer.callbacks.append(CheckpointEval(datamodule, role, opts.every, max_new, checkpoints))
    trainer.fit(module, datamodule=datamodule)
    record = {
        "arm": arm, "seed": seed, "lr": lr, "split": {"test": opts.eval_split, "val": "validation"}[role],
        "steps": int(trainer.global_step), "samples_per_step": 24, "config": ARMS[arm],
        "teacher": opts.teacher if arm == "distill" else None, "model": opts.model or "smollm2-135m-instruct",
        "checkpoints": checkpoints, "train_scores": train_scores(log_dir / f"{arm}_s{seed}_lr{lr:g}"),
        "wall_seconds": round(time.time() - started, 1), "created": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "machine": machine(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=None) + "\n")
    accuracy = {s: sum(c["correct"]) / len(c["correct"]) for s, c in checkpoints.items()}
    print(f"{arm} seed {seed} lr {lr:g} on {role}: greedy accuracy by step {accuracy} ({record['wall_seconds']} s)",
          flush=True)
    return record


def evaluate_policy(name: str, path: Path, opts: argparse.Namespace) -> dict:
    """A policy's own greedy answers, untrained, on the evaluation and the validation split."""
    if path.exists():
        return json.loads(path.read_text())
    cli = build("grpo", 0, SHIPPED_GRPO_LR, 1, opts.eval_split, Path(opts.logs), name, None, opts.extra)
    module, datamodule = cli.model, cli.datamodule
    datamodule.setup("fit")
    datamodule.setup("test")
    record = {"policy": name, "eval_split": opts.eval_split,
              "test": greedy_answers(module, datamodule, "test", module.sampling.max_new_tokens),
              "val": None if opts.test_only else greedy_answers(module, datamodule, "val", module.sampling.max_new_tokens),
              "created": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record) + "\n")
    for role in ("test",) if opts.test_only else ("test", "val"):
        print(f"{name} on {role}: greedy accuracy {sum(record[role]['correct']) / len(record[role]['correct']):.3f}",
              flush=True)
    return record


def evaluate_policies(out: Path, opts: argparse.Namespace) -> None:
    """`teacher.json` (the teacher) and `start_test.json`, `start_val.json` (the start's answers:
    every run's step 0)."""
    if not (out / "start_test.json").exists() and not opts.test_only:
        start = evaluate_policy(opts.model or "smollm2-135m-instruct", out / "start.json", opts)
        for role in ("test", "val"):
            (out / f"start_{role}.json").write_text(json.dumps({"policy": start["policy"], "answers": start[role]}) + "\n")
        (out / "start.json").unlink()
    evaluate_policy(opts.teacher, out / "teacher.json", opts)


def select(opts: argparse.Namespace, out: Path) -> float:
    """arm `distill`'s lr: the highest mean validation accuracy over the checkpoints after step 0
    of `--select-steps` steps (default 8, the primary checkpoint: steps 4 and 8)."""
    choice_path = out / "select" / "choice.json"
    if choice_path.exists():
        return json.loads(choice_path.read_text())["lr"]
    scores = {}
    for lr in opts.lrs:
        record = run_arm("distill", opts.selection_seed, lr, "val", out / "select" / f"distill_lr{lr:g}.json", opts,
                         opts.select_steps)
        later = [c for s, c in record["checkpoints"].items() if int(s) > 0]
        scores[lr] = sum(sum(c["correct"]) / len(c["correct"]) for c in later) / max(1, len(later))
    best = max(scores.values())
    lr = min(lr for lr, score in scores.items() if score == best)
    choice_path.write_text(json.dumps({"lr": lr, "grid": opts.lrs, "seed": opts.selection_seed, "steps": opts.select_steps,
                                       "mean_val_accuracy_after_step_0": {f"{k:g}": v for k, v in scores.items()}},
                                      indent=1) + "\n")
    print(f"chosen lr for distill: {lr:g} (mean validation accuracy {scores})", flush=True)
    return lr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--logs", default="outputs/distill_vs_grpo", help="the training logs (not committed)")
    parser.add_argument("--teacher", default="outputs/verifiable_math/policy")
    parser.add_argument("--model", default=None, help="the student's start (default: the configs', SmolLM2-135M-Instruct)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[11, 12, 13])
    parser.add_argument("--selection-seed", type=int, default=0)
    parser.add_argument("--lrs", type=float, nargs="+", default=[2e-5, 1e-4])
    parser.add_argument("--distill-lr", type=float, default=SHIPPED_GRPO_LR,
                        help="arm distill's lr without a selection (default: grpo's); 0: choose from --lrs")
    parser.add_argument("--only", choices=["policies", "select", "grpo", "distill"], default=None,
                        help="one part alone (parallel runs): the teacher's and the start's answers, or one arm")
    parser.add_argument("--test-only", action="store_true",
                        help="--only policies: the teacher on the evaluation split alone (each run scores its own step 0)")
    parser.add_argument("--seed", type=int, default=None, help="with --only grpo/distill: its seed")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--select-steps", type=int, default=8, help="steps of each selection run")
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--eval-split", default="test[:60]")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("extra", nargs="*", help="more CLI overrides for every run (after --)")
    opts = parser.parse_args(argv)
    if opts.selection_seed in opts.seeds:
        parser.error(f"the selection seed {opts.selection_seed} is among the reported seeds {opts.seeds}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(opts.threads)
    out = opts.out
    if opts.only == "policies":
        evaluate_policies(out, opts)
        return 0
    if opts.only == "select":  # the validation selection of distill's lr alone
        select(opts, out)
        return 0
    lr = opts.distill_lr or select(opts, out)
    arm_lr = {"grpo": SHIPPED_GRPO_LR, "distill": lr}
    if opts.only:
        if opts.seed is None or opts.seed == opts.selection_seed:
            parser.error("--only grpo/distill needs --seed, a reported seed")
        run_arm(opts.only, opts.seed, arm_lr[opts.only], "test", out / "runs" / f"{opts.only}_s{opts.seed}.json", opts)
        return 0
    evaluate_policies(out, opts)
    for seed in opts.seeds:
        for arm in ("grpo", "distill"):
            run_arm(arm, seed, arm_lr[arm], "test", out / "runs" / f"{arm}_s{seed}.json", opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
