"""A miniature replication of the DRO paper's single-trajectory comparison, with exact expectations.

    python -m experiments.dro_single_trajectory.run --profile full --out outputs/dro_single_trajectory

1. Task (`task.py`): one-digit arithmetic answered with one token, graded reward
   1 - |answer - truth| / 9 for a digit token (0 for any other token). Disjoint validation,
   training and held-out problems.
2. Triplets: `samples_per_prompt` exact draws per training prompt from the starting policy's
   next-token distribution (`exact.sample`, seed `data_seed`), each scored by the reward:
   `<out>/triplets.jsonl`. Rewards are normalised to mean 0 / variance 1 over the triplets for
   the methods that read them (DRO paper, Sec. 4).
3. Arms (`arms/*.yaml`), every one on data derived from the same triplets and given the same
   number of passes over it (`epochs`): DRO-V, its two ablations in the paper's forms, the
   paper's KTO (unweighted, labels from the batch mean, ties unlabelled) with its temperature
   swept, DPO on best-vs-worst pairs, SFT on the above-mean completions (and, by name only, the
   optional `drov_value_first`: V fitted alone for a pass before DRO-V's). Each arm's settings
   (its `sweep` grid: the lr, and KTO's beta) are chosen by the validation prompts' exact
   expected reward, trained with `sweep_seed`; the chosen settings are then trained once per
   reported seed (`seeds`, never `sweep_seed`).
4. Evaluation on the held-out prompts, exact (`exact.py`): expected reward, greedy reward,
   KL to the start, win rates, and for arms with a value the fit of V(x) to its target.
   Statistics (`report.py`, `lit_rlhf.evaluation.paired`): hierarchical bootstrap over seeds
   then prompts, paired differences, the exact sign test; DRO-V against every arm and the start.
5. Output in `<out>`: `results.json`, `results.md`, `reward_vs_kl.png`, and `samples.json`
   (every per-prompt number of every run and the held-out reward levels, for any re-analysis).
6. The same files read four more ways (`reading.py`: win rates with their verdicts, the
   regularised objective, the distance to pi*, the reward-vs-KL frontier and where Eq. 8
   converges with each form of V): `reading.json`, `reading.md`, `frontier.png`.

Every budget knob is in `budget.yaml` (`--profile`, `--set key=value`).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import itertools
import json
import platform
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import lightning as L
import torch
import yaml

from experiments.dro_single_trajectory import exact, reading, report, task
from experiments.dro_single_trajectory.measures import evaluate, sample_mean_fit, value_fit
from experiments.dro_single_trajectory.triplets import (TripletDataModule, draw_triplets, read_triplets,
                                                       reward_statistics, write_triplets)
from experiments.overrides import parse_set
from lit_rlhf import models

HERE = Path(__file__).resolve().parent
ARMS_DIR = HERE / "arms"
REFERENCE_ARM = report.REFERENCE_ARM


# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------

def load_budget(profile: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The knobs of one profile of `budget.yaml`, with `overrides` (unknown keys refused)."""
    profiles = yaml.safe_load((HERE / "budget.yaml").read_text())
    if profile not in profiles:
        raise ValueError(f"unknown profile {profile!r}; budget.yaml has {sorted(profiles)}")
    budget = dict(profiles[profile])
    for key, value in (overrides or {}).items():
        if key not in budget:
            raise ValueError(f"unknown budget knob {key!r}; known: {sorted(budget)}")
        budget[key] = value
    if min(budget["train_prompts"], budget["val_prompts"], budget["test_prompts"]) < 1:
        raise ValueError("train_prompts, val_prompts and test_prompts must all be >= 1")
    if budget["epochs"] < 1:
        raise ValueError(f"epochs must be >= 1, got {budget['epochs']}")
    if not budget["seeds"]:
        raise ValueError("seeds must list at least one seed")
    if budget["sweep_seed"] in budget["seeds"]:
        raise ValueError(f"sweep_seed {budget['sweep_seed']} is also a reported seed {budget['seeds']}: the run that "
                         "chose the settings would be reported; pick a sweep_seed outside seeds")
    return budget


def load_arms(names: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """The arm configs of `arms/` (`names`, or every arm not marked `optional: true`), by name;
    DRO-V first."""
    available = {p.stem: p for p in sorted(ARMS_DIR.glob("*.yaml"))}
    if not names:
        names = [n for n in sorted(available, key=lambda n: (n != REFERENCE_ARM, n))
                 if not yaml.safe_load(available[n].read_text()).get("optional", False)]
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}; arms/ has {sorted(available)}")
    arms = {}
    for name in names:
        cfg = yaml.safe_load(available[name].read_text())
        for key in ("module", "data", "lr_args", "sweep"):
            if key not in cfg:
                raise ValueError(f"arms/{name}.yaml has no {key!r}")
        if "lr" not in cfg["sweep"] or not all(cfg["sweep"].values()):
            raise ValueError(f"arms/{name}.yaml: sweep needs an 'lr' list and non-empty lists, got {cfg['sweep']}")
        arms[name] = cfg
    return arms


def settings_grid(arm: dict[str, Any], sweep: bool) -> list[dict[str, Any]]:
    """The settings an arm is tried with: every combination of its `sweep` lists (in order), or,
    without a sweep, the middle value of each list."""
    keys = list(arm["sweep"])
    if not sweep:
        return [{k: arm["sweep"][k][len(arm["sweep"][k]) // 2] for k in keys}]
    return [dict(zip(keys, values)) for values in itertools.product(*(arm["sweep"][k] for k in keys))]


def choose(sweep: list[dict[str, Any]]) -> dict[str, Any]:
    """The settings with the best validation expected reward; ties: the first in grid order
    (the grids list smaller lrs first)."""
    best = max(range(len(sweep)), key=lambda i: (sweep[i]["val_expected_reward"], -i))
    return sweep[best]["params"]


def module_class(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # Llama's linears


def lora_spec(budget: dict[str, Any]) -> dict[str, Any] | None:
    """The `lora` argument of every arm's module from the budget's `lora` knob ({r, alpha,
    layers}; null = full fine-tuning): adapters on every linear layer of the listed blocks only,
    so the frozen blocks below them need no backward pass."""
    spec = budget.get("lora")
    if spec is None:
        return None
    return {"class_path": "peft.LoraConfig",
            "init_args": {"r": int(spec["r"]), "lora_alpha": float(spec["alpha"]), "lora_dropout": 0.0,
                          "target_modules": LORA_TARGETS, "layers_to_transform": list(spec["layers"])}}


def build_module(arm: dict[str, Any], params: dict[str, Any], budget: dict[str, Any], **extra: Any):
    """The arm's module with `params` (the lr goes to every `lr_args` name, the rest as they are)
    and any `extra` constructor arguments."""
    kwargs = dict(arm.get("init_args") or {}) | extra
    kwargs.update({key: params["lr"] for key in arm["lr_args"]})
    kwargs.update({k: v for k, v in params.items() if k != "lr"})
    return module_class(arm["module"])(model=budget["model"], warmup_steps=budget["warmup_steps"],
                                       lr_scheduler="constant", lora=lora_spec(budget), **kwargs)


# --------------------------------------------------------------------------------------------
# training and exact evaluation
# --------------------------------------------------------------------------------------------

def train(arm: dict[str, Any], params: dict[str, Any], seed: int, triplets: Path, budget: dict[str, Any]):
    """One run: `epochs` passes over the arm's data (after `value_first_epochs` passes that fit
    DRO-V's value alone, for an arm that asks for them). Returns (module, optimizer steps)."""
    pad = models.load_tokenizer(budget["model"]).pad_token_id
    data = TripletDataModule(triplets, arm["data"], pad, budget["batch_size"], seed=seed)  # its own generator
    value_first = int(arm.get("value_first_epochs", 0))
    extra = {}
    if value_first:  # value-only passes first: their steps, counted on the arm's own batches
        extra["value_warmup_steps"] = value_first * len(data.train_dataloader())
    L.seed_everything(seed, verbose=False)
    module = build_module(arm, params, budget, **extra)
    epochs = budget["epochs"] + value_first
    expected = epochs * (len(data.examples) // data.batch_size)
    trainer = L.Trainer(accelerator="cpu", devices=1, precision="32", max_epochs=epochs, max_steps=-1,
                        gradient_clip_val=budget["max_grad_norm"], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        num_sanity_val_steps=0, log_every_n_steps=1)
    trainer.fit(module, datamodule=data)
    if trainer.global_step != expected:
        raise RuntimeError(f"{arm['module']} took {trainer.global_step} steps, expected {expected}")
    return module, trainer.global_step


# --------------------------------------------------------------------------------------------
# the experiment
# --------------------------------------------------------------------------------------------

def run(profile: str = "full", out: str | Path = "outputs/dro_single_trajectory", arms: Sequence[str] | None = None,
        overrides: dict[str, Any] | None = None, token_rewards: task.TokenRewards = task.graded_rewards,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole experiment (module docstring); returns what `results.json` holds. Runs with
    `threads` torch threads (the caller's setting is restored after)."""
    threads = torch.get_num_threads()
    try:
        return _run(profile, out, arms, overrides, token_rewards, log)
    finally:
        torch.set_num_threads(threads)


def _run(profile, out, arms, overrides, token_rewards, log) -> dict[str, Any]:
    started = time.perf_counter()
    budget = load_budget(profile, overrides)
    arm_cfgs = load_arms(arms)
    if REFERENCE_ARM not in arm_cfgs:
        raise ValueError(f"the arms must include {REFERENCE_ARM!r} (every comparison is against it)")
    torch.set_num_threads(budget["threads"])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seconds = {"sweep": 0.0, "training": 0.0, "evaluation": 0.0}

    # 1-2. problems, the start's exact distributions, the triplets
    t0 = time.perf_counter()
    tokenizer = models.load_tokenizer(budget["model"])
    start = models.load_causal_lm(budget["model"], tokenizer).eval().requires_grad_(False)
    values = task.digit_values(tokenizer, start.get_output_embeddings().weight.shape[0])
    split = task.split_problems(budget["val_prompts"], budget["train_prompts"], budget["test_prompts"])
    rows = {role: task.prompt_rows(tokenizer, split[role]) for role in ("train", "val", "test")}
    rewards = {role: task.reward_matrix(rows[role], values, token_rewards) for role in rows}
    pad = tokenizer.pad_token_id
    start_logp = {role: exact.next_token_logprobs(start, rows[role], pad, budget["eval_batch_size"]) for role in rows}
    triplets = draw_triplets(rows["train"], start_logp["train"], rewards["train"], budget["samples_per_prompt"],
                             budget["data_seed"], tokenizer)
    path = write_triplets(out / "triplets.jsonl", triplets)
    stats = reward_statistics(read_triplets(path))
    seconds["sampling"] = time.perf_counter() - t0
    log(f"{len(triplets)} triplets, mean reward {stats['mean']:.3f} (std {stats['std']:.3f}) -> {path}")
    examples = {}
    for arm in arm_cfgs.values():  # every arm's data checked before any training
        data = TripletDataModule(path, arm["data"], pad, budget["batch_size"])
        examples[arm["data"]] = len(data.examples)
    log(f"training examples per data mode: {examples}")
    normalised_test = (rewards["test"] - stats["mean"]) / stats["std"]
    normalised_train = (rewards["train"] - stats["mean"]) / stats["std"]
    memorised_r2 = sample_mean_fit(read_triplets(path), start_logp["train"], normalised_train, stats["mean"], stats["std"])
    optimum_logp = exact.regularised_optimum(start_logp["test"], normalised_test, budget["optimum_tau"])
    start_eval = evaluate(start_logp["test"], start_logp["test"], rewards["test"])
    del start
    gc.collect()

    # 3. settings chosen on the validation prompts, then every reported seed
    per_arm: dict[str, Any] = {}
    for name, arm in arm_cfgs.items():
        sweep = []
        for params in settings_grid(arm, budget["sweep"]):
            t0 = time.perf_counter()
            module, _ = train(arm, params, budget["sweep_seed"], path, budget)
            val = exact.expected_reward(exact.next_token_logprobs(module.policy, rows["val"], pad, budget["eval_batch_size"]), rewards["val"])
            seconds["sweep"] += time.perf_counter() - t0
            sweep.append({"params": params, "val_expected_reward": float(val.mean())})
            log(f"sweep {name} {params}: validation expected reward {float(val.mean()):.4f}")
            del module
            if budget["collect_garbage"]:
                gc.collect()
        params = choose(sweep)
        runs = []
        for seed in budget["seeds"]:
            t0 = time.perf_counter()
            module, steps = train(arm, params, seed, path, budget)
            seconds["training"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            logp = exact.next_token_logprobs(module.policy, rows["test"], pad, budget["eval_batch_size"])
            held = evaluate(logp, start_logp["test"], rewards["test"])
            r2 = value_fit(module, rows["test"], logp, start_logp["test"], normalised_test, budget["eval_batch_size"])
            r2_train = None
            if r2 is not None:  # the same fit on the prompts V was trained on: does V learn at all?
                train_logp = exact.next_token_logprobs(module.policy, rows["train"], pad, budget["eval_batch_size"])
                r2_train = value_fit(module, rows["train"], train_logp, start_logp["train"], normalised_train,
                                     budget["eval_batch_size"])
            seconds["evaluation"] += time.perf_counter() - t0
            runs.append({"seed": seed, "steps": steps, "value_r2": r2, "value_r2_train": r2_train, **held})
            log(f"{name} {params} seed {seed}: expected reward {sum(held['expected_reward']) / len(logp):.4f}, "
                f"KL {sum(held['kl']) / len(logp):.4f}, value R^2 {r2}")
            del module, logp
            if budget["collect_garbage"]:
                gc.collect()
        per_arm[name] = {"params": params, "sweep": sweep, "runs": runs}

    # 4. statistics over seeds x prompts
    resamples, boot_seed = budget["bootstrap_resamples"], budget["eval_seed"]
    ours = per_arm[REFERENCE_ARM]["runs"]
    table: dict[str, Any] = {}
    for name, arm in per_arm.items():
        row = {"params": arm["params"], "sweep": arm["sweep"], "steps": arm["runs"][0]["steps"],
               **report.arm_statistics(arm["runs"], resamples, boot_seed),
               "per_seed": [{k: r.get(k) for k in ("seed", "steps", "value_r2", "value_r2_train")} | {
                   k: sum(r[k]) / len(r[k]) for k in ("expected_reward", "greedy_reward", "kl")} for r in arm["runs"]],
               "versus_start": report.comparison(arm["runs"], [start_eval], resamples, boot_seed)}
        if name != REFERENCE_ARM:
            row["versus_" + REFERENCE_ARM] = report.comparison(ours, arm["runs"], resamples, boot_seed)
        table[name] = row
    start_row = {**report.arm_statistics([start_eval], resamples, boot_seed),
                 "versus_" + REFERENCE_ARM: table[REFERENCE_ARM]["versus_start"]}
    optimum = {"tau": budget["optimum_tau"],
               "expected_reward": float(exact.expected_reward(optimum_logp, rewards["test"]).mean()),
               "greedy_reward": float(exact.greedy_reward(optimum_logp, rewards["test"]).mean()),
               "kl": float(exact.kl(optimum_logp, start_logp["test"]).mean())}
    samples = {"test_prompts": [r["prompt"] for r in rows["test"]], "start": start_eval,
               "reward_levels": [torch.unique(r).tolist() for r in rewards["test"]],  # `levels`' order
               "arms": {name: {"params": arm["params"], "runs": arm["runs"]} for name, arm in per_arm.items()}}
    seconds["total"] = time.perf_counter() - started
    results = {
        "budget": budget, "profile": profile,
        "data": {"triplets": len(triplets), "examples_per_mode": examples, "reward_mean": stats["mean"],
                 "reward_std": stats["std"], "sample_mean_value_r2_train": memorised_r2,
                 "train_prompts": len(rows["train"]), "val_prompts": len(rows["val"]), "test_prompts": len(rows["test"])},
        "start": start_row, "optimum": optimum, "arms": table, "seconds": seconds,
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
                    "lightning": L.__version__, "threads": torch.get_num_threads()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    (out / "samples.json").write_text(json.dumps(samples))
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(report.markdown_table(results))
    report.figure(results, out / "reward_vs_kl.png")
    log(report.markdown_table(results))
    log(reading.markdown(reading.write(out)))
    return results


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="full", help="a profile of budget.yaml (full, smoke)")
    parser.add_argument("--out", default="outputs/dro_single_trajectory")
    parser.add_argument("--arms", nargs="*", default=None, help="arm names (default: every arms/*.yaml)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override budget knobs")
    args = parser.parse_args(argv)
    return run(args.profile, args.out, args.arms, parse_set(args.set))


if __name__ == "__main__":
    main()
