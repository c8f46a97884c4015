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
   pi_start). Statistics over seeds x prompts (`lit_rlhf.evaluation.paired`): each arm's numbers
   with a hierarchical bootstrap interval (seeds, then prompts); DRO-V against every other arm
   and against the starting policy, paired cell by cell (seed s, prompt i; both arms' samples
   drawn with the same seed), with a bootstrap interval of the difference and the exact sign
   test on per-prompt differences. The win rate (sample j of prompt i of DRO-V against sample j
   of the other arm, ties half) only when rewards are graded: with 0/1 rewards it is
   1/2 + (mean difference)/2 exactly. The lr is chosen with `sweep_seed`, never a reported seed.
5. Output in `<out>`: `results.json`, `results.md` (the table), `reward_vs_kl.png`, and
   `samples.json`, every per-prompt score of every run (for any paired re-analysis).

Every budget knob is in `budget.yaml` (`--profile`, `--set key=value`).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
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
    if budget["sweep_seed"] in budget["seeds"]:
        raise ValueError(f"sweep_seed {budget['sweep_seed']} is also a reported seed {budget['seeds']}: the run that "
                         "chose the lr would be reported; pick a sweep_seed outside seeds")
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
    log_ratios: list[list[float]] = []
    for part, batch, ids, mask, _ in generate_chunks(policy, tokenizer, rows, n, config, budget["eval_seed"], chunk):
        flat = score(part, decode_responses(tokenizer, ids, mask), n)
        rewards += [flat[i * n:(i + 1) * n] for i in range(len(part))]
        if not kl:
            continue
        prompt_mask = batch.attention_mask.bool()
        logp = sequence_token_logps(policy, batch.input_ids, prompt_mask, ids, mask).sum(dim=1)  # (chunk*n,)
        logq = sequence_token_logps(reference, batch.input_ids, prompt_mask, ids, mask).sum(dim=1)
        flat_ratios = (logp - logq).tolist()
        log_ratios += [flat_ratios[i * n:(i + 1) * n] for i in range(len(part))]
    result.update(sampled_rewards=rewards, mean_reward=sum(map(sum, rewards)) / (len(rewards) * n))
    if kl:  # per prompt: the mean over its samples of sum_t log pi - log pi_start
        result["kl_per_prompt"] = [sum(r) / n for r in log_ratios]
        result["kl"] = sum(result["kl_per_prompt"]) / len(log_ratios)
    return result


def win_rate(ours: list[list[float]], theirs: list[list[float]]) -> float:
    """Mean over prompts and samples of 1[ours > theirs] + 1/2 1[ours == theirs] (paired samples)."""
    pairs = [(a, b) for row_a, row_b in zip(ours, theirs, strict=True) for a, b in zip(row_a, row_b, strict=True)]
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs) / len(pairs)


def per_prompt_means(samples: list[list[float]]) -> list[float]:
    """The mean of each prompt's sampled scores: (P, n) -> (P,)."""
    return [sum(row) / len(row) for row in samples]


def is_binary(runs: Sequence[dict[str, Any]]) -> bool:
    """True when every sampled and greedy reward is 0 or 1: the win rate is then 1/2 + (mean
    difference)/2 exactly (a win is +1 - 0, a loss 0 - 1, a tie 0), so it adds nothing to the
    paired difference of mean rewards and is not reported."""
    values = {v for r in runs for v in r["greedy_rewards"]} | {v for r in runs for row in r["sampled_rewards"] for v in row}
    return values <= {0.0, 1.0}


def cell(stat) -> dict[str, float]:
    """A table cell from a `BootstrapMean` (mean, low, high, p_value, seeds, prompts)."""
    return {"mean": stat.mean, "low": stat.ci_low, "high": stat.ci_high, "p_value": stat.p_value,
            "seeds": stat.num_seeds, "prompts": stat.num_prompts}


def arm_statistics(runs: Sequence[dict[str, Any]], num_resamples: int, seed: int) -> dict[str, dict[str, float]]:
    """Accuracy, mean reward and KL of one arm over its seeds x held-out prompts, each with its
    hierarchical bootstrap interval (`lit_rlhf.evaluation.paired.bootstrap_mean`)."""
    from lit_rlhf.evaluation.paired import bootstrap_mean

    grids = {"accuracy": [r["greedy_rewards"] for r in runs],
             "mean_reward": [per_prompt_means(r["sampled_rewards"]) for r in runs],
             "kl": [r["kl_per_prompt"] for r in runs]}
    return {key: cell(bootstrap_mean(grid, num_resamples, seed=seed)) for key, grid in grids.items()}


def comparison(ours: Sequence[dict[str, Any]], theirs: Sequence[dict[str, Any]], num_resamples: int, seed: int,
               with_win_rate: bool) -> dict[str, Any]:
    """Paired comparison of two arms (or of an arm and the starting policy, one 'run'): the
    differences ours - theirs of greedy accuracy and of mean sampled reward, cell by cell
    (seed s of ours against seed s of theirs, or against the start for every seed; prompt i
    against prompt i), with the hierarchical bootstrap interval and p-value, and the exact sign
    test on the per-prompt differences averaged over seeds; the win rate when rewards are graded."""
    from lit_rlhf.evaluation.paired import paired_bootstrap, sign_test

    out: dict[str, Any] = {}
    for key, of in (("accuracy", lambda r: r["greedy_rewards"]),
                    ("mean_reward", lambda r: per_prompt_means(r["sampled_rewards"]))):
        a, b = [of(r) for r in ours], [of(r) for r in theirs]
        stat = paired_bootstrap(a, b, num_resamples, seed=seed)
        b = b * len(a) if len(b) == 1 else b
        per_prompt = [sum(x[i] - y[i] for x, y in zip(a, b)) / len(a) for i in range(len(a[0]))]
        sign = sign_test(per_prompt)
        out[key] = {**cell(stat), "verdict": stat.verdict, "sign_test": sign._asdict()}
    if with_win_rate:
        theirs_runs = list(theirs) * len(ours) if len(theirs) == 1 else theirs
        out["win_rate_per_seed"] = [win_rate(x["sampled_rewards"], y["sampled_rewards"]) for x, y in zip(ours, theirs_runs)]
    return out


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


def _diff(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "-"
    return (f"{cell['mean']:+.3f} [{cell['low']:+.3f}, {cell['high']:+.3f}] "
            f"(sign test p={cell['sign_test']['p_value']:.2g})")


def markdown_table(results: dict[str, Any]) -> str:
    ref = REFERENCE_ARM
    lines = [
        f"| arm | lr | held-out greedy accuracy | held-out mean reward (T=1) | KL to start | "
        f"{ref} - arm, mean reward | {ref} - arm, greedy accuracy |",
        "|---|---|---|---|---|---|---|",
    ]
    start = results["start"]
    versus = start.get("versus_" + ref)
    lines.append(f"| start (no training) | - | {_fmt(start['accuracy'])} | {_fmt(start['mean_reward'])} | 0 | "
                 f"{_diff(versus and versus['mean_reward'])} | {_diff(versus and versus['accuracy'])} |")
    for name, row in results["arms"].items():
        versus = row.get("versus_" + ref)
        lines.append(f"| {name} | {row['lr']:.1e} | {_fmt(row['accuracy'])} | {_fmt(row['mean_reward'])} | "
                     f"{_fmt(row['kl'])} | {_diff(versus and versus['mean_reward'])} | "
                     f"{_diff(versus and versus['accuracy'])} |")
    b = results["budget"]
    lines.append("")
    lines.append(f"Mean [95% hierarchical bootstrap interval: seeds, then prompts; {b['bootstrap_resamples']} "
                 f"resamples] over seeds {b['seeds']} x {b['test_prompts']} held-out prompts ({b['eval_samples']} "
                 f"sampled completion(s) each); the start's accuracy interval is Clopper-Pearson over prompts. "
                 f"Differences are paired cell by cell; the sign test is exact, on the per-prompt differences "
                 f"averaged over seeds. lr chosen with seed {b['sweep_seed']} (not reported); "
                 f"{results['data']['triplets']} training triplets ({b['train_prompts']} prompts x "
                 f"{b['samples_per_prompt']}), {b['steps']} steps of {b['batch_size']} sequences; model {b['model']}.")
    if results["binary_rewards"]:
        lines.append("Rewards are 0/1, so the win rate (1/2 + mean difference/2 exactly) is not reported.")
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
    ax.scatter([0.0], [results["start"]["mean_reward"]["mean"]], marker="s", color="black", label="start")
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

    # 4. statistics over seeds x prompts (lit_rlhf.evaluation.paired), and the per-sample results
    from lit_rlhf.evaluation.paired import bootstrap_mean, clopper_pearson_interval

    resamples, boot_seed = budget["bootstrap_resamples"], budget["eval_seed"]
    binary = is_binary([r for arm in per_arm.values() for r in arm["runs"]] + [start_eval])
    start_run = [start_eval]
    ours = per_arm[REFERENCE_ARM]["runs"]
    table: dict[str, Any] = {}
    for name, arm in per_arm.items():
        row = {"lr": arm["lr"], "sweep": arm["sweep"], **arm_statistics(arm["runs"], resamples, boot_seed),
               "per_seed": [{k: r[k] for k in ("seed", "accuracy", "mean_reward", "kl")} for r in arm["runs"]],
               "versus_start": comparison(arm["runs"], start_run, resamples, boot_seed, not binary)}
        if name != REFERENCE_ARM:
            row["versus_" + REFERENCE_ARM] = comparison(ours, arm["runs"], resamples, boot_seed, not binary)
        table[name] = row
    correct = int(round(sum(start_eval["greedy_rewards"]))) if binary else None
    start_accuracy = cell(bootstrap_mean([start_eval["greedy_rewards"]], resamples, seed=boot_seed))
    if binary:  # one policy, P prompts, 0/1 scores: the exact binomial interval
        start_accuracy["low"], start_accuracy["high"] = clopper_pearson_interval(correct, len(start_eval["greedy_rewards"]))
    start_row = {"accuracy": start_accuracy,
                 "mean_reward": cell(bootstrap_mean([per_prompt_means(start_eval["sampled_rewards"])], resamples,
                                                    seed=boot_seed)),
                 "kl": start_eval["kl"], "val_accuracy": start_val["accuracy"],
                 "versus_" + REFERENCE_ARM: table[REFERENCE_ARM]["versus_start"]}
    samples = {"start": {k: start_eval[k] for k in ("greedy_rewards", "sampled_rewards")},
               "arms": {name: {"lr": arm["lr"], "runs": [{k: r[k] for k in ("seed", "greedy_rewards", "sampled_rewards",
                                                                            "kl_per_prompt")} for r in arm["runs"]]}
                        for name, arm in per_arm.items()},
               "test_prompts": [r["prompt"] for r in rows["test"]]}
    seconds["total"] = time.perf_counter() - started
    results = {
        "budget": budget, "profile": profile, "binary_rewards": binary,
        "data": {"triplets": len(triplets), "examples_per_mode": examples, "reward_mean": stats["mean"], "reward_std": stats["std"],
                 "train_prompts": len(rows["train"]), "val_prompts": len(rows["val"]),
                 "test_prompts": len(rows["test"])},
        "start": start_row,
        "arms": table, "seconds": seconds,
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
                    "lightning": L.__version__, "threads": torch.get_num_threads()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    (out / "samples.json").write_text(json.dumps(samples))
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
