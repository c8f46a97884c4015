"""A miniature replication of the DRO paper's single-trajectory comparison, with an exact reward.

    python -m experiments.dro_single_trajectory.run --profile full --out outputs/dro_single_trajectory

1. Prompts: the bundled arithmetic word problems (`QADataModule`, `bundled:arithmetic`); the
   train split's rows [0, val_prompts) are the validation slice of the lr sweep, rows
   [val_prompts, val_prompts + train_prompts) the training prompts, and the test split's first
   `test_prompts` rows the held-out prompts (never trained on nor swept on).
2. Triplets: `samples_per_prompt` completions per training prompt from the starting policy at
   temperature 1, each scored by the exact reward (`MathAnswerReward`: 1 when the final answer
   is right, else 0), written to `<out>/triplets.jsonl`.
3. Arms (`arms/*.yaml`): the same triplets, steps, batch size and seeds; each arm's lr is the
   one of its `lrs` with the best validation-slice greedy accuracy (ties: higher sampled mean
   reward, then the smaller lr), trained with `sweep_seed`; then that lr is trained once per seed.
4. Evaluation on the held-out prompts, per run: greedy accuracy (mean exact reward of the greedy
   answer), mean exact reward of `eval_samples` completions per prompt sampled at temperature 1,
   KL(pi || pi_start) estimated on those samples (mean over samples of sum_t log pi - log
   pi_start), and the win rate of DRO-V against every other arm: per seed, sample j of prompt i
   of DRO-V against sample j of prompt i of the other arm (both drawn with the same seed), the
   exact reward decides, ties count half. Intervals: 95% Student t over seeds.
5. Output in `<out>`: `results.json`, `results.md` (the table) and `reward_vs_kl.png`.

Every budget knob is in `budget.yaml` (`--profile`, `--set key=value`).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import math
import platform
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import lightning as L
import torch
import yaml

from experiments.dro_single_trajectory.triplets import (
    TripletDataModule,
    generate_chunks,
    read_triplets,
    reward_statistics,
    sample_triplets,
    write_triplets,
)
from lit_rlhf import models
from lit_rlhf.generation import SamplingConfig, decode_responses, sequence_token_logps

HERE = Path(__file__).resolve().parent
ARMS_DIR = HERE / "arms"
REFERENCE_ARM = "drov"
PROMPT_TEMPLATE = "Question: {question}\nAnswer:"


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
    if budget["train_prompts"] < 1 or budget["val_prompts"] < 1 or budget["test_prompts"] < 1:
        raise ValueError("train_prompts, val_prompts and test_prompts must all be >= 1")
    if not budget["seeds"]:
        raise ValueError("seeds must list at least one seed")
    return budget


def load_arms(names: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """The arm configs of `arms/` (all, or `names`), by name; DRO-V first."""
    available = {p.stem: p for p in sorted(ARMS_DIR.glob("*.yaml"))}
    names = list(names) if names else sorted(available, key=lambda n: (n != REFERENCE_ARM, n))
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}; arms/ has {sorted(available)}")
    arms = {}
    for name in names:
        cfg = yaml.safe_load(available[name].read_text())
        for key in ("module", "data", "lr_args", "lrs"):
            if key not in cfg:
                raise ValueError(f"arms/{name}.yaml has no {key!r}")
        arms[name] = cfg
    return arms


def module_class(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


# --------------------------------------------------------------------------------------------
# prompts, training, evaluation
# --------------------------------------------------------------------------------------------

def prompt_rows(budget: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """{"train", "val", "test"}: the formatted prompt rows (prompt, reference, _prompt_ids)."""
    from lit_rlhf.data import QADataModule

    v, t = budget["val_prompts"], budget["train_prompts"]
    dm = QADataModule("bundled:arithmetic", tokenizer=budget["model"], schema="gsm8k", chat=False,
                      prompt_template=PROMPT_TEMPLATE, train_split=f"train[{v}:{v + t}]", val_split=f"train[:{v}]",
                      test_split=f"test[:{budget['test_prompts']}]", max_prompt_length=budget["max_prompt_length"])
    dm.setup("fit")
    dm.setup("test")
    rows = {role: [dict(r) for r in dm.dataset(role)] for role in ("train", "val", "test")}
    seen = {r["prompt"] for r in rows["train"]}
    if any(r["prompt"] in seen for r in rows["val"] + rows["test"]):
        raise ValueError("a validation or held-out prompt is also a training prompt")
    return rows


def balanced_desirable_weight(triplets: Sequence[dict[str, Any]]) -> float:
    """n_U / n_D over the triplets (desirable = reward above the mean): the KTO weight that puts
    lambda_D n_D / (lambda_U n_U) at 1, the low end of the KTO paper's [1, 4/3] (Sec. 4.2)."""
    stats = reward_statistics(triplets)
    desirable = sum(float(t["reward"]) > stats["mean"] for t in triplets)
    return (len(triplets) - desirable) / desirable


def build_module(arm: dict[str, Any], lr: float, budget: dict[str, Any], triplets: Path | None = None):
    """The arm's module at learning rate `lr`; `desirable_weight: balanced` is resolved from the triplets."""
    kwargs = dict(arm.get("init_args") or {})
    if kwargs.get("desirable_weight") == "balanced":
        if triplets is None:
            raise ValueError("desirable_weight: balanced needs the triplets")
        kwargs["desirable_weight"] = balanced_desirable_weight(read_triplets(triplets))
    kwargs.update({key: lr for key in arm["lr_args"]})
    return module_class(arm["module"])(model=budget["model"], warmup_steps=budget["warmup_steps"],
                                       lr_scheduler="constant", **kwargs)


def train(arm: dict[str, Any], lr: float, seed: int, triplets: Path, budget: dict[str, Any]):
    """One run: the arm's module trained `steps` steps on the triplets; returns the module."""
    L.seed_everything(seed, verbose=False)
    module = build_module(arm, lr, budget, triplets)
    data = TripletDataModule(triplets, arm["data"], module.tokenizer.pad_token_id, budget["batch_size"], seed=seed)
    trainer = L.Trainer(accelerator="cpu", devices=1, precision="32", max_steps=budget["steps"], max_epochs=-1,
                        gradient_clip_val=budget["max_grad_norm"], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        num_sanity_val_steps=0, log_every_n_steps=1)
    trainer.fit(module, datamodule=data)
    if trainer.global_step != budget["steps"]:
        raise RuntimeError(f"{arm['module']} took {trainer.global_step} steps, expected {budget['steps']}")
    return module


@torch.no_grad()
def evaluate(policy, reference, tokenizer, rows: Sequence[dict[str, Any]], budget: dict[str, Any],
             reward_fn: Callable[..., list[float]], sampled: bool = True, kl: bool = True) -> dict[str, Any]:
    """Greedy accuracy, and (with `sampled`) the sampled rewards (per prompt, `eval_samples`
    each) and their mean, and (with `kl`) the KL estimate to `reference`, on `rows`."""
    policy.eval()
    n_tokens, chunk = budget["max_new_tokens"], budget["chunk"]

    def score(prompts_rows, texts, n):
        return reward_fn([r["prompt"] for r in prompts_rows for _ in range(n)], texts,
                         reference=[r["reference"] for r in prompts_rows for _ in range(n)])

    greedy: list[float] = []
    config = SamplingConfig(max_new_tokens=n_tokens, temperature=1.0, do_sample=False)
    for part, _, ids, mask, _ in generate_chunks(policy, tokenizer, rows, 1, config, 0, chunk):
        greedy += score(part, decode_responses(tokenizer, ids, mask), 1)
    result: dict[str, Any] = {"accuracy": sum(greedy) / len(greedy), "greedy_rewards": greedy}
    if not sampled:
        return result
    n = budget["eval_samples"]
    config = SamplingConfig(max_new_tokens=n_tokens, temperature=1.0)
    rewards: list[list[float]] = []
    log_ratios: list[float] = []
    for part, batch, ids, mask, _ in generate_chunks(policy, tokenizer, rows, n, config, budget["eval_seed"], chunk):
        flat = score(part, decode_responses(tokenizer, ids, mask), n)
        rewards += [flat[i * n:(i + 1) * n] for i in range(len(part))]
        if not kl:
            continue
        prompt_mask = batch.attention_mask.bool()
        logp = sequence_token_logps(policy, batch.input_ids, prompt_mask, ids, mask).sum(dim=1)  # (chunk*n,)
        logq = sequence_token_logps(reference, batch.input_ids, prompt_mask, ids, mask).sum(dim=1)
        log_ratios += (logp - logq).tolist()
    result.update(sampled_rewards=rewards, mean_reward=sum(map(sum, rewards)) / (len(rewards) * n),
                  kl=sum(log_ratios) / len(log_ratios) if kl else None)
    return result


def win_rate(ours: list[list[float]], theirs: list[list[float]]) -> float:
    """Mean over prompts and samples of 1[ours > theirs] + 1/2 1[ours == theirs] (paired samples)."""
    pairs = [(a, b) for row_a, row_b in zip(ours, theirs, strict=True) for a, b in zip(row_a, row_b, strict=True)]
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs) / len(pairs)


def interval(values: Sequence[float]) -> dict[str, float]:
    """Mean and its 95% Student t interval over seeds (a point when there is one value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return {"mean": mean, "low": mean, "high": mean, "n": n}
    from scipy.stats import t

    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}


def choose_lr(sweep: list[dict[str, Any]]) -> float:
    """Best validation greedy accuracy; ties: higher sampled mean reward, then the smaller lr."""
    return max(sweep, key=lambda s: (s["val_accuracy"], s["val_mean_reward"], -s["lr"]))["lr"]


# --------------------------------------------------------------------------------------------
# outputs
# --------------------------------------------------------------------------------------------

def _fmt(cell: dict[str, float] | None) -> str:
    if cell is None:
        return "-"
    return f"{cell['mean']:.3f} [{cell['low']:.3f}, {cell['high']:.3f}]"


def markdown_table(results: dict[str, Any]) -> str:
    lines = [
        f"| arm | lr | held-out greedy accuracy | held-out mean reward (T=1) | KL to start | "
        f"{REFERENCE_ARM} win rate vs arm |",
        "|---|---|---|---|---|---|",
    ]
    start = results["start"]
    lines.append(f"| start (no training) | - | {start['accuracy']:.3f} | {start['mean_reward']:.3f} | 0 | - |")
    for name, row in results["arms"].items():
        lines.append(f"| {name} | {row['lr']:.1e} | {_fmt(row['accuracy'])} | {_fmt(row['mean_reward'])} | "
                     f"{_fmt(row['kl'])} | {_fmt(row.get('win_rate_of_' + REFERENCE_ARM))} |")
    b = results["budget"]
    lines.append("")
    lines.append(f"Mean [95% t interval] over seeds {b['seeds']}; {b['test_prompts']} held-out prompts, "
                 f"{b['eval_samples']} sampled completion(s) each; {results['data']['triplets']} training triplets "
                 f"({b['train_prompts']} prompts x {b['samples_per_prompt']}), {b['steps']} steps of "
                 f"{b['batch_size']} sequences; model {b['model']}.")
    m = results["machine"]
    lines.append(f"Measured {results['date']} on {m['platform']} ({m['threads']} torch threads; Python {m['python']}, "
                 f"torch {m['torch']}, lightning {m['lightning']}); {results['seconds']['total'] / 60:.1f} min in all.")
    return "\n".join(lines) + "\n"


def figure(results: dict[str, Any], path: Path) -> Path:
    """Held-out mean reward against KL to the starting policy, one point per arm (95% intervals)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([0.0], [results["start"]["mean_reward"]], marker="s", color="black", label="start")
    for name, row in results["arms"].items():
        kl, reward = row["kl"], row["mean_reward"]
        ax.errorbar(kl["mean"], reward["mean"], xerr=[[kl["mean"] - kl["low"]], [kl["high"] - kl["mean"]]],
                    yerr=[[reward["mean"] - reward["low"]], [reward["high"] - reward["mean"]]], fmt="o",
                    capsize=3, label=name)
    ax.set_xlabel("KL(pi || pi_start), sampled estimate (nats)")
    ax.set_ylabel("held-out mean exact reward (T=1)")
    ax.set_title("single-trajectory arms: reward vs KL")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------
# the experiment
# --------------------------------------------------------------------------------------------

def run(profile: str = "full", out: str | Path = "outputs/dro_single_trajectory", arms: Sequence[str] | None = None,
        overrides: dict[str, Any] | None = None, reward_fn: Callable[..., list[float]] | None = None,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole experiment (module docstring); returns what `results.json` holds. Runs with
    `threads` torch threads (the caller's setting is restored after)."""
    threads = torch.get_num_threads()
    try:
        return _run(profile, out, arms, overrides, reward_fn, log)
    finally:
        torch.set_num_threads(threads)


def _run(profile, out, arms, overrides, reward_fn, log) -> dict[str, Any]:
    started = time.perf_counter()
    budget = load_budget(profile, overrides)
    arm_cfgs = load_arms(arms)
    if REFERENCE_ARM not in arm_cfgs:
        raise ValueError(f"the arms must include {REFERENCE_ARM!r} (the win rates are measured against it)")
    if reward_fn is None:
        from lit_rlhf.rewards import MathAnswerReward

        reward_fn = MathAnswerReward()
    torch.set_num_threads(budget["threads"])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}

    # 1-2. prompts and triplets from the starting policy
    t0 = time.perf_counter()
    rows = prompt_rows(budget)
    tokenizer = models.load_tokenizer(budget["model"])
    start = models.load_causal_lm(budget["model"], tokenizer).eval().requires_grad_(False)
    config = SamplingConfig(max_new_tokens=budget["max_new_tokens"], temperature=1.0)
    triplets = sample_triplets(start, tokenizer, rows["train"], budget["samples_per_prompt"], config, reward_fn,
                               budget["data_seed"], budget["chunk"])
    path = write_triplets(out / "triplets.jsonl", triplets)
    stats = reward_statistics(read_triplets(path))
    seconds["sampling"] = time.perf_counter() - t0
    log(f"{len(triplets)} triplets, mean reward {stats['mean']:.3f} (std {stats['std']:.3f}) -> {path}")
    examples = {}
    for name, arm in arm_cfgs.items():  # every arm's data checked before any training
        data = TripletDataModule(path, arm["data"], tokenizer.pad_token_id, budget["batch_size"])
        examples[arm["data"]] = len(data.examples)
    log(f"training examples per data mode: {examples}")

    t0 = time.perf_counter()
    start_eval = evaluate(start, start, tokenizer, rows["test"], budget, reward_fn)
    start_val = evaluate(start, start, tokenizer, rows["val"], budget, reward_fn, sampled=False)
    seconds["evaluation"] = time.perf_counter() - t0
    seconds["sweep"] = seconds["training"] = 0.0

    # 3. lr sweep on the validation slice, then the chosen lr on every seed
    per_arm: dict[str, Any] = {}
    for name, arm in arm_cfgs.items():
        sweep = []
        lrs = arm["lrs"] if budget["sweep"] else [arm["lrs"][len(arm["lrs"]) // 2]]
        for lr in lrs:
            t0 = time.perf_counter()
            module = train(arm, lr, budget["sweep_seed"], path, budget)
            val = evaluate(module.policy, start, tokenizer, rows["val"], budget, reward_fn, kl=False)
            seconds["sweep"] += time.perf_counter() - t0
            sweep.append({"lr": lr, "val_accuracy": val["accuracy"], "val_mean_reward": val["mean_reward"]})
            log(f"sweep {name} lr {lr:.1e}: val accuracy {val['accuracy']:.3f}, mean reward {val['mean_reward']:.3f}")
            del module
            if budget["collect_garbage"]:
                gc.collect()
        lr = choose_lr(sweep)
        runs = []
        for seed in budget["seeds"]:
            t0 = time.perf_counter()
            module = train(arm, lr, seed, path, budget)
            seconds["training"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            held = evaluate(module.policy, start, tokenizer, rows["test"], budget, reward_fn)
            seconds["evaluation"] += time.perf_counter() - t0
            runs.append({"seed": seed, **held})
            log(f"{name} lr {lr:.1e} seed {seed}: accuracy {held['accuracy']:.3f}, "
                f"mean reward {held['mean_reward']:.3f}, KL {held['kl']:.4f}")
            del module
            if budget["collect_garbage"]:
                gc.collect()
        per_arm[name] = {"lr": lr, "sweep": sweep, "runs": runs}

    # 4. aggregate over seeds
    ours = {r["seed"]: r["sampled_rewards"] for r in per_arm[REFERENCE_ARM]["runs"]}
    table: dict[str, Any] = {}
    for name, arm in per_arm.items():
        row = {"lr": arm["lr"], "sweep": arm["sweep"],
               **{key: interval([r[key] for r in arm["runs"]]) for key in ("accuracy", "mean_reward", "kl")},
               "per_seed": [{k: r[k] for k in ("seed", "accuracy", "mean_reward", "kl")} for r in arm["runs"]]}
        if name != REFERENCE_ARM:
            wins = [win_rate(ours[r["seed"]], r["sampled_rewards"]) for r in arm["runs"]]
            row["win_rate_of_" + REFERENCE_ARM] = interval(wins)
            for entry, w in zip(row["per_seed"], wins):
                entry["win_rate_of_" + REFERENCE_ARM] = w
        table[name] = row
    seconds["total"] = time.perf_counter() - started
    results = {
        "budget": budget, "profile": profile,
        "data": {"triplets": len(triplets), "examples_per_mode": examples, "reward_mean": stats["mean"], "reward_std": stats["std"],
                 "train_prompts": len(rows["train"]), "val_prompts": len(rows["val"]),
                 "test_prompts": len(rows["test"])},
        "start": {"accuracy": start_eval["accuracy"], "mean_reward": start_eval["mean_reward"],
                  "kl": start_eval["kl"], "val_accuracy": start_val["accuracy"]},
        "arms": table, "seconds": seconds,
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
                    "lightning": L.__version__, "threads": torch.get_num_threads()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(markdown_table(results))
    figure(results, out / "reward_vs_kl.png")
    log(markdown_table(results))
    return results


def _value(text: str) -> Any:
    return yaml.safe_load(text)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="full", help="a profile of budget.yaml (full, smoke)")
    parser.add_argument("--out", default="outputs/dro_single_trajectory")
    parser.add_argument("--arms", nargs="*", default=None, help="arm names (default: every arms/*.yaml)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override budget knobs")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key] = _value(value)
    return run(args.profile, args.out, args.arms, overrides)


if __name__ == "__main__":
    main()
