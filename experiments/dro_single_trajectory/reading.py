"""The miniature's results read four more ways, from the saved files alone (no model, no training).

    python -m experiments.dro_single_trajectory.reading experiments/dro_single_trajectory/results/main \
        --readme experiments/README.md

reads `results.json` and `samples.json` in that directory and writes beside them `reading.json`,
`reading.md` (the tables experiments/README.md shows: `--readme` puts them in its
`<!-- reading:main -->` block) and `frontier.png`. Everything is exact
over the held-out prompts' reward levels (`exact.py`); the statistics are `report.py`'s
(hierarchical bootstrap over seeds then prompts, paired cell by cell, exact sign test).

1. Win rate, the paper's kind of metric: DRO-V's exact win rate against each arm (independent
   draws, ties half), with its interval, the per-seed win rates (seed s against seed s) and the
   sign test of the per-prompt win rates (averaged over seeds) against 1/2. Verdict: an arm is
   ahead when the interval lies wholly on its side of 1/2.
2. The objective DRO-V optimises, J(pi) = E_pi[r_norm] - tau KL(pi || pi_start) (normalised
   rewards, tau as trained), per arm and DRO-V minus each arm, paired.
3. The distance to that objective's optimum, KL(pi || pi*), pi* ∝ pi_start exp(r_norm / tau)
   (`exact.kl_to_optimum`: log Z - J / tau, so J's shortfall from its best is tau KL(pi || pi*)).
4. Reward against KL: the exact frontier pi_beta ∝ pi_start exp(r / beta) (no policy has a higher
   mean reward at the same mean KL), each arm's mean reward beside the frontier's at its KL, and
   where DRO-V's gradient (Eq. 8) settles with each form of V, trained to convergence on unlimited
   draws from the start (`exact.offline_fixed_point`): V(x) (pi*), a single value, V = 0.

The reward levels of the held-out prompts are `samples.json`'s `reward_levels` when the run saved
them; a run from before that field (results/main) is read with the graded reward of `task.py`
rebuilt from the problem split, checked against the saved prompts and the start's mass count.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

import torch

from experiments.dro_single_trajectory import exact, task
from experiments.dro_single_trajectory.measures import distance_to_optimum, regularised_objective
from experiments.dro_single_trajectory.report import REFERENCE_ARM, _fmt, cell
from experiments.readme_block import render_into

FIXED_POINT_VALUES = ("per_prompt", "single", "zero")
FIXED_POINT_NAMES = {"per_prompt": "V(x) (DRO-V): pi*", "single": "a single value", "zero": "V = 0"}


# --------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------

def saved_levels(levels: Sequence[Sequence[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged per-prompt reward levels (ascending) as (P, L) zero-padded levels and a valid mask."""
    width = max(len(row) for row in levels)
    out = torch.zeros(len(levels), width, dtype=torch.float64)
    valid = torch.zeros(len(levels), width, dtype=torch.bool)
    for i, row in enumerate(levels):
        out[i, :len(row)], valid[i, :len(row)] = torch.tensor(row, dtype=torch.float64), True
    return out, valid


def graded_levels(results: dict[str, Any], samples: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out prompts' levels under `task.graded_rewards`, for a run that did not save them:
    the split rebuilt from the budget must give the saved prompts. A vocabulary of one non-digit
    token and the ten digits has every level a real vocabulary has (0 and 1 - k/9)."""
    b = results["budget"]
    rows = task.split_problems(b["val_prompts"], b["train_prompts"], b["test_prompts"])["test"]
    if [task.PROMPT_TEMPLATE.format(question=r["question"]) for r in rows] != samples["test_prompts"]:
        raise ValueError("the problem split rebuilt from the budget does not give the saved held-out prompts")
    return exact.reward_levels(task.reward_matrix(rows, torch.tensor([-1] + list(range(10)))))


def level_inputs(results: dict[str, Any], samples: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The held-out prompts' raw and normalised reward levels, the valid mask and the start's
    level masses, checked against each other (the start's mass lies on the real levels only)."""
    if samples.get("reward_levels") is not None:
        levels, valid = saved_levels(samples["reward_levels"])
    else:
        levels, valid = graded_levels(results, samples)
    start = torch.tensor(samples["start"]["levels"], dtype=torch.float64)
    width = max(start.shape[1], levels.shape[1])
    pad = lambda t, fill: torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill)  # noqa: E731
    levels, valid, start = pad(levels, 0.0), pad(valid, False), pad(start, 0.0)
    if (start[~valid] != 0).any() or not torch.allclose(start.sum(-1), torch.ones(len(start), dtype=torch.float64)):
        raise ValueError("the start's saved level masses do not fit the reward levels")
    mean, std = results["data"]["reward_mean"], results["data"]["reward_std"]
    normalised = torch.where(valid, (levels - mean) / std, torch.zeros_like(levels))
    return {"levels": levels, "normalised": normalised, "valid": valid, "start": start}


def trained_tau(results: dict[str, Any]) -> float:
    """The tau DRO-V was trained with: the reference optimum's (budget `optimum_tau`, the DRO-V arms' tau)."""
    return float(results["optimum"]["tau"])


# --------------------------------------------------------------------------------------------
# the four readings
# --------------------------------------------------------------------------------------------

def win_rate_verdict(ours: Sequence[dict[str, Any]], theirs: Sequence[dict[str, Any]], num_resamples: int,
                     seed: int) -> dict[str, Any]:
    """Our exact win rate against theirs (seed s against seed s, prompt i against prompt i): its
    interval, the per-seed win rates, the sign test of per-prompt win rates (mean over seeds)
    against 1/2, and the verdict."""
    from lit_rlhf.evaluation.paired import bootstrap_mean, sign_test

    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} seeds against {len(theirs)}")
    wins = [exact.win_rate_of_levels(torch.tensor(x["levels"]), torch.tensor(y["levels"])) for x, y in zip(ours, theirs)]
    centred = bootstrap_mean([(w - 0.5).tolist() for w in wins], num_resamples, seed=seed)
    out = {k: v + 0.5 if k in ("mean", "low", "high") else v for k, v in cell(centred).items()}
    per_prompt = torch.stack(wins).mean(0) - 0.5
    out["sign_test"] = sign_test(per_prompt.tolist())._asdict()  # positive: prompts where we win more than half
    out["per_seed"] = [float(w.mean()) for w in wins]
    out["verdict"] = "DRO-V ahead" if out["low"] > 0.5 else "arm ahead" if out["high"] < 0.5 else "no detectable difference"
    return out


def seed_pairs_above(ours: Sequence[dict[str, Any]], theirs: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """How many (our seed, their seed) pairs have their mean expected reward above ours, of all pairs."""
    mean_of = lambda run: sum(run["expected_reward"]) / len(run["expected_reward"])  # noqa: E731
    return sum(mean_of(y) > mean_of(x) for x in ours for y in theirs), len(ours) * len(theirs)


def paired_difference(ours: Sequence[Sequence[float]], theirs: Sequence[Sequence[float]], num_resamples: int,
                      seed: int) -> dict[str, Any]:
    """mean(ours - theirs) over seeds x prompts with its interval, and the sign test of the
    per-prompt differences averaged over seeds. `theirs` may be one row (the start)."""
    from lit_rlhf.evaluation.paired import paired_bootstrap, sign_test

    theirs = list(theirs) * len(ours) if len(theirs) == 1 else list(theirs)
    stat = paired_bootstrap(ours, theirs, num_resamples, seed=seed)
    per_prompt = [sum(a[i] - b[i] for a, b in zip(ours, theirs)) / len(ours) for i in range(len(ours[0]))]
    return {**cell(stat), "verdict": stat.verdict, "sign_test": sign_test(per_prompt)._asdict()}


def analyse(results: dict[str, Any], samples: dict[str, Any], fixed_points: bool = True) -> dict[str, Any]:
    """The four readings (module docstring) of one run's saved files, as `reading.json` holds them."""
    from lit_rlhf.evaluation.paired import bootstrap_mean

    resamples, boot_seed = results["budget"]["bootstrap_resamples"], results["budget"]["eval_seed"]
    tau = trained_tau(results)
    mean, std = results["data"]["reward_mean"], results["data"]["reward_std"]
    inputs = level_inputs(results, samples)
    levels, normalised, valid, start = inputs["levels"], inputs["normalised"], inputs["valid"], inputs["start"]
    log_z = exact.log_partition(start, normalised, valid, tau)

    runs = {"start": [samples["start"]]} | {name: arm["runs"] for name, arm in samples["arms"].items()}
    objective = {name: [regularised_objective(r, mean, std, tau) for r in rs] for name, rs in runs.items()}
    distance = {name: [distance_to_optimum(r, log_z, mean, std, tau) for r in rs] for name, rs in runs.items()}
    ours = runs[REFERENCE_ARM]
    arms: dict[str, Any] = {}
    for name, rs in runs.items():
        mean_kl = sum(sum(r["kl"]) for r in rs) / sum(len(r["kl"]) for r in rs)
        mean_reward = sum(sum(r["expected_reward"]) for r in rs) / sum(len(r["expected_reward"]) for r in rs)
        beta, frontier_reward = exact.frontier_at_kl(start, normalised, valid, mean_kl, levels)
        row = {"expected_reward": mean_reward, "kl": mean_kl,
               "objective": cell(bootstrap_mean(objective[name], resamples, seed=boot_seed)),
               "kl_to_optimum": cell(bootstrap_mean(distance[name], resamples, seed=boot_seed)),
               "frontier_reward_at_kl": frontier_reward, "frontier_beta": beta * std,  # beta on the raw reward's scale
               "below_frontier": mean_reward - frontier_reward}
        if name != "start":
            arm = results["arms"][name]
            grid = next(iter(arm["sweep"]))["params"].keys()
            lrs = sorted({s["params"]["lr"] for s in arm["sweep"]})
            row.update(params=arm["params"], lr_grid=lrs, lr_at_grid_top=arm["params"]["lr"] == lrs[-1],
                       swept=sorted(grid))
        if name != REFERENCE_ARM:
            row["versus_" + REFERENCE_ARM] = {
                "win_rate": win_rate_verdict(ours, rs * len(ours) if name == "start" else rs, resamples, boot_seed),
                "seed_pairs_arm_above": seed_pairs_above(ours, rs),
                "objective": paired_difference(objective[REFERENCE_ARM], objective[name], resamples, boot_seed),
                "kl_to_optimum": paired_difference(distance[REFERENCE_ARM], distance[name], resamples, boot_seed)}
        arms[name] = row

    optimum_reward = float((exact.tilted_levels(start, normalised, valid, tau) * levels).sum(-1).mean())
    out: dict[str, Any] = {
        "tau": tau, "reward_mean": mean, "reward_std": std, "source": results.get("date"),
        "optimum": {"expected_reward": optimum_reward, "objective": float((tau * log_z).mean())},
        "arms": arms,
        "frontier": exact.frontier(start, normalised, valid, torch.logspace(-1.5, 3, 90, dtype=torch.float64),
                                   levels).tolist(),
    }
    if fixed_points:
        out["fixed_points"] = {}
        log_start = exact.log_masses(start, valid)
        for value in FIXED_POINT_VALUES:
            masses, v = exact.offline_fixed_point(start, normalised, valid, tau, value)
            logp = exact.log_masses(masses, valid)
            kl_start = torch.where(masses > 0, masses * (logp - log_start), torch.zeros_like(masses)).sum(-1)
            expected = (masses * normalised).sum(-1)
            out["fixed_points"][value] = {
                "expected_reward": float((masses * levels).sum(-1).mean()), "kl": float(kl_start.mean()),
                "objective": float((expected - tau * kl_start).mean()),
                "kl_to_optimum": float(exact.kl_to_optimum(expected, kl_start, log_z, tau).mean()), "value": v}
    return out


# --------------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------------

def _sign(test: dict[str, Any]) -> str:
    return f"{test['positive']} to {test['negative']}, p={test['p_value']:.2g}"


def markdown(reading: dict[str, Any]) -> str:
    """The tables of `reading.md`."""
    tau, ref = reading["tau"], REFERENCE_ARM
    arms = reading["arms"]
    lines = [f"| arm | {ref} win rate vs arm [95%] (prompts {ref} ahead to behind, sign test p) | per-seed win rates | "
             f"verdict | seed pairs with the arm's mean reward above {ref}'s | J = E[r_norm] - tau KL | "
             f"{ref} - arm, J (prompts {ref} ahead to behind, sign test p) | KL(pi \\|\\| pi*) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, row in arms.items():
        versus = row.get("versus_" + ref)
        if versus is None:
            head, diff = ["-", "-", "-", "-"], "-"
        else:
            w = versus["win_rate"]
            above, pairs = versus["seed_pairs_arm_above"]
            head = [f"{_fmt(w)} ({_sign(w['sign_test'])})", " ".join(f"{x:.3f}" for x in w["per_seed"]), w["verdict"],
                    f"{above} of {pairs}"]
            diff = f"{_fmt(versus['objective'], True)} ({_sign(versus['objective']['sign_test'])})"
        lines.append(f"| {name} | {head[0]} | {head[1]} | {head[2]} | {head[3]} | {_fmt(row['objective'], True)} | "
                     f"{diff} | {_fmt(row['kl_to_optimum'])} |")
    lines.append(f"| optimum pi* (tau {tau:g}) | - | - | - | - | {reading['optimum']['objective']:+.3f} | - | 0 |")
    lines += ["", "| arm | chosen lr (grid) | expected reward | KL to start | frontier's reward at that KL | "
                  "arm - frontier |", "|---|---|---|---|---|---|"]
    for name, row in arms.items():
        lr = "-" if "params" not in row else (f"{row['params']['lr']:.0e} ({', '.join(f'{x:.0e}' for x in row['lr_grid'])}"
                                              f"{'; top of the grid' if row['lr_at_grid_top'] else ''})")
        lines.append(f"| {name} | {lr} | {row['expected_reward']:.3f} | {row['kl']:.3f} | "
                     f"{row['frontier_reward_at_kl']:.3f} | {row['below_frontier']:+.3f} |")
    if "fixed_points" in reading:
        lines += ["", "| DRO's gradient (Eq. 8) at convergence, tabular, with | expected reward | KL to start | J | "
                      "KL(pi \\|\\| pi*) | V |", "|---|---|---|---|---|---|"]
        for value, row in reading["fixed_points"].items():
            lines.append(f"| {FIXED_POINT_NAMES[value]} | {row['expected_reward']:.3f} | {row['kl']:.3f} | "
                         f"{row['objective']:+.3f} | {row['kl_to_optimum']:.3f} | {row['value']:.3f} |")
    lines += ["", (
        f"Exact, over the held-out prompts' reward levels, from `results.json` and `samples.json` "
        f"(`python -m experiments.dro_single_trajectory.reading <dir>`). Win rate: {ref}'s against the arm, "
        f"independent draws, ties half, paired seed s with seed s; 95% hierarchical bootstrap interval (seeds, "
        f"then prompts); sign test of the per-prompt win rates (mean over seeds) against 1/2. J: the objective "
        f"{ref} optimises, on the normalised rewards r_norm = (r - {reading['reward_mean']:.3f}) / "
        f"{reading['reward_std']:.3f}, tau {tau:g}, KL to the start; pi*'s J is its largest value, and an arm's "
        f"shortfall from it is tau KL(pi || pi*) (so the paired difference of KL(pi || pi*), in `reading.json`, "
        f"is minus the J difference over tau). Frontier: pi_beta ∝ pi_start exp(r / beta), no policy has a "
        f"higher mean reward at the same mean KL. Tabular fixed points: where Eq. 8's expected gradient vanishes, "
        f"one logit per reward level and prompt, unlimited draws from the start; V their value (a mean over "
        f"prompts for V(x)).")]
    return "\n".join(lines) + "\n"


def figure(reading: dict[str, Any], path) -> Any:
    """Held-out expected reward against KL to the start: the frontier, each arm, pi* and the
    tabular fixed points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    curve = torch.tensor(reading["frontier"])
    ax.plot(curve[:, 0], curve[:, 1], color="gray", lw=1, label="frontier pi_beta ∝ start exp(r/beta)")
    markers = {"per_prompt": "*", "single": "P", "zero": "X"}
    for value, row in reading.get("fixed_points", {}).items():
        ax.scatter([row["kl"]], [row["expected_reward"]], marker=markers[value], s=80, color="black", zorder=3,
                   label=f"converged, {FIXED_POINT_NAMES[value]}")
    for name, row in reading["arms"].items():
        ax.scatter([row["kl"]], [row["expected_reward"]], marker="s" if name == "start" else "o", zorder=4, label=name)
    ax.set_xscale("symlog", linthresh=0.01)
    ax.set_xlabel("KL(pi || pi_start), exact (nats)")
    ax.set_ylabel("held-out expected reward, exact")
    ax.set_title("reward vs KL: arms at their budget, and where Eq. 8 converges")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(directory: str | Path, fixed_points: bool = True) -> dict[str, Any]:
    """`reading.json`, `reading.md` and `frontier.png` (when matplotlib is installed) in `directory`."""
    directory = Path(directory)
    results = json.loads((directory / "results.json").read_text())
    samples = json.loads((directory / "samples.json").read_text())
    reading = analyse(results, samples, fixed_points)
    (directory / "reading.json").write_text(json.dumps(reading, indent=2))
    (directory / "reading.md").write_text(markdown(reading))
    try:
        figure(reading, directory / "frontier.png")
    except ImportError:  # the tables carry every number
        pass
    return reading


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="a run's output directory (results.json, samples.json)")
    parser.add_argument("--no-fixed-points", action="store_true", help="skip the tabular fixed points (~15 s)")
    parser.add_argument("--render", action="store_true",
                        help="only render reading.md and frontier.png again from the saved reading.json")
    parser.add_argument("--readme", default=None,
                        help="also put reading.md into this file's <!-- reading:DIRNAME --> block")
    args = parser.parse_args(argv)
    directory = Path(args.directory)
    if args.render:
        result = json.loads((directory / "reading.json").read_text())
        (directory / "reading.md").write_text(markdown(result))
        figure(result, directory / "frontier.png")
    else:
        result = write(directory, not args.no_fixed_points)
    if args.readme:
        render_into(args.readme, directory.name, markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
