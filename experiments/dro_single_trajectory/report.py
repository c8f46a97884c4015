"""Statistics, table and figure of the miniature, from its exact per-prompt results.

Every run (an arm at one seed) is summarised per held-out prompt by exact quantities
(`exact.py`): expected reward, greedy reward, KL to the start, and the reward-level masses its
win rates are computed from. Over seeds x prompts (`lit_rlhf.evaluation.paired`):

- each arm's means, with the hierarchical bootstrap interval (seeds, then prompts);
- DRO-V against each other arm and against the starting policy, paired cell by cell (seed s
  against seed s, or against the start at every seed; prompt i against prompt i): the
  difference of expected (and greedy) reward with its bootstrap interval and p-value, the exact
  sign test on the per-prompt differences averaged over seeds, and DRO-V's exact win rate
  (independent draws, ties half) with its bootstrap interval.

Decision rule, fixed before the runs: a comparison is a win for DRO-V when the 95% interval of
the expected-reward difference lies above 0, a loss when below, "no detectable difference"
otherwise; the win rate and the sign test are reported beside it, not used to decide.
`reading.py`, written after the run, reads the same files with a win-rate verdict of its own, the
regularised objective, the distance to pi* and the reward-vs-KL frontier.
"""

from __future__ import annotations

from typing import Any, Sequence

REFERENCE_ARM = "drov"


def cell(stat) -> dict[str, float]:
    """A table cell from a `BootstrapMean`."""
    return {"mean": stat.mean, "low": stat.ci_low, "high": stat.ci_high, "p_value": stat.p_value,
            "seeds": stat.num_seeds, "prompts": stat.num_prompts}


def arm_statistics(runs: Sequence[dict[str, Any]], num_resamples: int, seed: int) -> dict[str, dict[str, float]]:
    """Each per-prompt quantity of an arm, over its seeds x prompts, with its bootstrap interval."""
    from lit_rlhf.evaluation.paired import bootstrap_mean

    keys = ("expected_reward", "greedy_reward", "kl", "win_rate_vs_start")
    return {k: cell(bootstrap_mean([r[k] for r in runs], num_resamples, seed=seed)) for k in keys if k in runs[0]}


def comparison(ours: Sequence[dict[str, Any]], theirs: Sequence[dict[str, Any]], num_resamples: int,
               seed: int) -> dict[str, Any]:
    """Ours against theirs, paired (module docstring). `theirs` may be one run (the start)."""
    import torch

    from lit_rlhf.evaluation.paired import bootstrap_mean, paired_bootstrap, sign_test
    from experiments.dro_single_trajectory.exact import win_rate_of_levels

    theirs = list(theirs) * len(ours) if len(theirs) == 1 else list(theirs)
    if len(theirs) != len(ours):
        raise ValueError(f"{len(ours)} seeds against {len(theirs)}")
    out: dict[str, Any] = {}
    for key in ("expected_reward", "greedy_reward"):
        a, b = [r[key] for r in ours], [r[key] for r in theirs]
        stat = paired_bootstrap(a, b, num_resamples, seed=seed)
        per_prompt = [sum(x[i] - y[i] for x, y in zip(a, b)) / len(a) for i in range(len(a[0]))]
        out[key] = {**cell(stat), "verdict": stat.verdict, "sign_test": sign_test(per_prompt)._asdict()}
    wins = [win_rate_of_levels(torch.tensor(x["levels"]), torch.tensor(y["levels"])).tolist() for x, y in zip(ours, theirs)]
    out["win_rate"] = cell(bootstrap_mean(wins, num_resamples, seed=seed))
    return out


def _fmt(c: dict[str, float] | None, signed: bool = False) -> str:
    if c is None:
        return "-"
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"{f.format(c['mean'])} [{f.format(c['low'])}, {f.format(c['high'])}]"


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.0e}" if k.endswith("lr") else f"{k} {v:g}" for k, v in params.items()) or "-"


def markdown_table(results: dict[str, Any]) -> str:
    ref = REFERENCE_ARM
    lines = [
        f"| arm | chosen on validation | steps | expected reward | greedy reward | KL to start | {ref} - arm, "
        f"expected reward (sign test p) | {ref} win rate vs arm | value R^2 held-out (training prompts) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    start, optimum = results["start"], results["optimum"]
    versus = start["versus_" + ref]
    lines.append(f"| start (no training) | - | 0 | {_fmt(start['expected_reward'])} | {_fmt(start['greedy_reward'])} | 0 | "
                 f"{_fmt(versus['expected_reward'], True)} (p={versus['expected_reward']['sign_test']['p_value']:.2g}) | "
                 f"{_fmt(versus['win_rate'])} | - |")
    for name, row in results["arms"].items():
        versus = row.get("versus_" + ref)
        diff = "-" if versus is None else (f"{_fmt(versus['expected_reward'], True)} "
                                           f"(p={versus['expected_reward']['sign_test']['p_value']:.2g})")
        r2 = [r["value_r2"] for r in row["per_seed"] if r.get("value_r2") is not None]
        r2_train = [r["value_r2_train"] for r in row["per_seed"] if r.get("value_r2_train") is not None]
        r2_text = f"{sum(r2) / len(r2):.2f}" if r2 else "-"
        if r2_train:
            r2_text += f" ({sum(r2_train) / len(r2_train):.2f})"
        lines.append(f"| {name} | {_params(row['params'])} | {row['steps']} | {_fmt(row['expected_reward'])} | "
                     f"{_fmt(row['greedy_reward'])} | {_fmt(row['kl'])} | {diff} | "
                     f"{_fmt(versus and versus['win_rate'])} | {r2_text} |")
    lines.append(f"| optimum pi* (tau {optimum['tau']:g}) | - | - | {optimum['expected_reward']:.3f} | "
                 f"{optimum['greedy_reward']:.3f} | {optimum['kl']:.3f} | - | - | - |")
    b, d = results["budget"], results["data"]
    lines += ["", (
        f"Exact expectations over each policy's next-token distribution on {b['test_prompts']} held-out prompts; "
        f"mean [95% hierarchical bootstrap interval, seeds then prompts, {b['bootstrap_resamples']} resamples] over "
        f"seeds {b['seeds']}. Differences and win rates are paired cell by cell; the sign test is exact, on the "
        f"per-prompt differences averaged over seeds. Settings chosen on {b['val_prompts']} validation prompts with "
        f"seed {b['sweep_seed']} (not reported). {d['triplets']} training triplets ({b['train_prompts']} prompts x "
        f"{b['samples_per_prompt']} draws from the start), mean reward {d['reward_mean']:.3f}; every arm "
        f"{b['epochs']} pass(es) over its data in batches of {b['batch_size']} sequences; model {b['model']}. "
        f"pi* is the KL-regularised optimum of the normalised rewards (Theorem 1). Value R^2: 1 - MSE(V(x), "
        f"V_pi(x)) / Var(V_pi(x)) on the held-out prompts (in brackets: on the training prompts), mean over seeds, "
        f"V_pi(x) = E_start[r - tau log pi/pi_start] exactly."
    )]
    if d.get("sample_mean_value_r2_train") is not None:
        lines[-1] += (f" For scale: the per-prompt mean of the {b['samples_per_prompt']} draws (the V of a value that "
                      f"memorised its training data) has R^2 {d['sample_mean_value_r2_train']:.2f} on the training "
                      f"prompts against the start's V(x).")
    m = results["machine"]
    lines.append(f"Measured {results['date']} on {m['platform']} ({m['threads']} torch threads; Python {m['python']}, "
                 f"torch {m['torch']}, lightning {m['lightning']}); {results['seconds']['total'] / 60:.1f} min in all.")
    return "\n".join(lines) + "\n"


def figure(results: dict[str, Any], path) -> Any:
    """Held-out expected reward against KL to the start, one point per arm (95% intervals), the
    start and the regularised optimum."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([0.0], [results["start"]["expected_reward"]["mean"]], marker="s", color="black", label="start")
    optimum = results["optimum"]
    ax.scatter([optimum["kl"]], [optimum["expected_reward"]], marker="*", s=90, color="gray",
               label=f"optimum (tau {optimum['tau']:g})")
    for name, row in results["arms"].items():
        kl, reward = row["kl"], row["expected_reward"]
        ax.errorbar(kl["mean"], reward["mean"], xerr=[[kl["mean"] - kl["low"]], [kl["high"] - kl["mean"]]],
                    yerr=[[reward["mean"] - reward["low"]], [reward["high"] - reward["mean"]]], fmt="o",
                    capsize=3, label=name)
    ax.set_xlabel("KL(pi || pi_start), exact (nats)")
    ax.set_ylabel("held-out expected reward, exact")
    ax.set_title("single-trajectory arms: reward vs KL")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
