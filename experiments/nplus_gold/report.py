"""Statistics, decisions, tables and the figure of the N+ miniature.

Paired comparisons over the held-out posts (`lit_rlhf.evaluation.paired`): the mean difference
with its Student-t 95% interval, the exact sign test, and the win rate (ties half) with its Wilson
interval. The decision rules, fixed before the runs with their parameters in `budget.yaml`'s
`rules` (README, "N+ in miniature"); no rule picks a snapshot or an arm after seeing a result:

- R0, the positive control: `rules.control` (GRPO with the gold as its reward) passes when the
  interval of its held-out gold difference from SFT lies above 0.
- R1, the pipeline helps: an arm (DPO, PPO, GRPO) beats its SFT start when the interval of its
  held-out gold difference lies above 0; below 0 it is worse; otherwise no detectable difference.
  Read only where R0 passes (else the verdict is "not read": the method could not beat SFT even on
  the gold at this budget, so a proxy arm's failure says nothing about the proxy).
- P, the optimiser raised its proxy: an online arm's held-out proxy objective minus SFT's has its
  interval above 0. Where it did not, "the proxy is what fails" is not read for that arm (its
  optimiser failed first); `proxy_fails` is True only where R0 passes, P holds and R1 is not "beats".
- R2, the reward model learned its label source: its agreement with the gold on the held-out pairs
  the gold orders (the SFT policy's answers to the test posts) has its Wilson interval above 0.5.
  The gold is the source of its training labels, so this is not N+ D17 (agreement with a judge
  independent of the labels): it measures how well the proxy fits the labelling function on
  answers it never saw.
- R3, the proxy's cost: GRPO on the proxy reaches less gold than the control when the interval of
  (proxy arm - control) lies below 0.
- R4, over-optimisation (Gao et al. 2023): along the run past its KL budget, with SFT as snapshot
  0, the proxy at the last snapshot is above SFT's (interval above 0) while the gold at the last
  snapshot is below SFT's (interval below 0).
- R5, rise then fall (Gao et al. Fig. 1): the gold at the snapshot `rules.rise_at` is above SFT's
  (interval above 0) and the gold at the last snapshot is below it (interval below 0).
"""

from __future__ import annotations

import datetime
import json
import math
import sys
from pathlib import Path
from typing import Any

ARMS = ("dpo", "ppo", "grpo")  # the arms trained on the proxy (DPO on its pairs)
ONLINE = ("ppo", "grpo")  # the arms that optimise the proxy reward model online


def _side(d: dict[str, Any]) -> str:
    return "above 0" if d["ci_low"] > 0 else "below 0" if d["ci_high"] < 0 else "contains 0"


def compare(before: list[float], after: list[float]) -> dict[str, Any]:
    """after vs before, paired: difference, sign test, win rate."""
    from lit_rlhf.evaluation.paired import paired_difference, paired_win_rate, sign_test

    diff = paired_difference(before, after).as_dict()
    return {**diff, "interval": _side(diff), "sign_test": sign_test([a - b for a, b in zip(after, before)])._asdict(),
            "win_rate": paired_win_rate(before, after).as_dict()}


def length_buckets(log_ratios: list[float], wins: list[float], edges: list[float]) -> list[dict[str, Any]]:
    """Win rate (ties half) per bucket of log(policy tokens / reference tokens)."""
    from lit_rlhf.evaluation.paired import proportion

    bounds = [-math.inf, *edges, math.inf]
    out = []
    for low, high in zip(bounds[:-1], bounds[1:]):
        inside = [w for r, w in zip(log_ratios, wins) if low <= r < high]
        out.append({"low": low, "high": high, "n": len(inside),
                    **({"win_rate": proportion(sum(inside), len(inside)).as_dict()} if inside else {})})
    return out


def policy_summary(p: dict[str, Any], evaluation: dict[str, Any], edges: list[float]) -> dict[str, Any]:
    """One policy's means, and its gold win rate against the reference answers, overall and by length."""
    from lit_rlhf.evaluation.paired import proportion

    n = len(p["gold"])
    ref_gold = 1.0  # the gold of a reference against itself: key-fact recall 1 by construction
    wins = [1.0 if g > ref_gold else 0.5 if g == ref_gold else 0.0 for g in p["gold"]]
    ratios = [math.log(max(t, 1) / max(r, 1)) for t, r in zip(p["tokens"], evaluation["reference_tokens"])]
    return {
        "gold": sum(p["gold"]) / n, "proxy": sum(p["proxy"]) / n, "ended": proportion(sum(p["ended"]), n).as_dict(),
        "tokens": sum(p["tokens"]) / n, "reaches_reference": proportion(sum(g >= ref_gold for g in p["gold"]), n).as_dict(),
        "win_rate_vs_reference": proportion(sum(wins), n).as_dict(),
        "win_rate_vs_reference_by_length": length_buckets(ratios, wins, edges),
    }


SNAPSHOT = "grpo_past_kl@"  # the held-out snapshots of the run past its KL budget; SFT is snapshot 0


def _verdict(c: dict[str, Any], control_passes: bool) -> str:
    if not control_passes:
        return "not read (the positive control did not beat SFT)"
    return {"above 0": "beats SFT", "below 0": "worse than SFT"}.get(c["interval"], "no detectable difference")


def curve(policies: dict[str, Any]) -> list[str]:
    """The over-optimisation curve's points in rollout order: SFT (snapshot 0), then every snapshot."""
    snaps = sorted((name for name in policies if name.startswith(SNAPSHOT)), key=lambda n: int(n[len(SNAPSHOT):]))
    return ["sft", *snaps]


def decisions(policies: dict[str, Any], evaluation: dict[str, Any], rules: dict[str, Any]) -> dict[str, Any]:
    """R0-R5 and P (module docstring) on the held-out scores of every policy, by `rules` (budget.yaml)."""
    gold = {name: p["gold"] for name, p in policies.items()}
    proxy = {name: p["proxy"] for name, p in policies.items()}
    control = rules["control"]
    c0 = compare(gold["sft"], gold[control])
    passes = c0["interval"] == "above 0"
    out: dict[str, Any] = {"R0_positive_control": {"arm": control, **c0, "passes": passes}}
    out["R1_vs_sft"] = {}
    for arm in ARMS:
        c = compare(gold["sft"], gold[arm])
        out["R1_vs_sft"][arm] = {**c, "verdict": _verdict(c, passes)}
    out["P_proxy_raised"] = {}
    for arm in ONLINE:
        p = compare(proxy["sft"], proxy[arm])
        raised = p["interval"] == "above 0"
        out["P_proxy_raised"][arm] = {**p, "raised": raised,
                                      "proxy_fails": passes and raised and out["R1_vs_sft"][arm]["interval"] != "above 0"}
    out["sft_vs_start"] = compare(gold["start"], gold["sft"])
    agreement = evaluation["reward_model"].get("agreement_with_gold")
    out["R2_learned_label_source"] = None if not agreement or not agreement["n"] else agreement["ci_low"] > 0.5
    out["R3_proxy_vs_control"] = compare(gold[control], gold["grpo"])
    points = curve(policies)
    if len(points) >= 2:
        last, rise_at = points[-1], f"{SNAPSHOT}{rules['rise_at']}"
        if rise_at not in points:
            raise ValueError(f"rules.rise_at names {rise_at}, not a snapshot of this run ({points[1:]})")
        proxy_rise, gold_drop = compare(proxy["sft"], proxy[last]), compare(gold["sft"], gold[last])
        out["R4_over_optimisation"] = {"first": "sft", "last": last, "proxy_last_vs_sft": proxy_rise,
                                       "gold_last_vs_sft": gold_drop,
                                       "shown": proxy_rise["interval"] == "above 0" and gold_drop["interval"] == "below 0"}
        rise, fall = compare(gold["sft"], gold[rise_at]), compare(gold[rise_at], gold[last])
        out["R5_rise_then_fall"] = {"rise_at": rise_at, "last": last, "gold_rise_vs_sft": rise,
                                    "gold_last_vs_rise": fall,
                                    "shown": rise["interval"] == "above 0" and fall["interval"] == "below 0"}
    return out


def build(budget: dict[str, Any], profile: str, stages: dict[str, Any], evaluation: dict[str, Any],
          curves: dict[str, Any], started: float) -> dict[str, Any]:
    from lit_rlhf.apps.compare_policies import machine

    edges = budget["length_buckets"]
    policies = evaluation["policies"]
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "created": now.isoformat(timespec="seconds"),
        "minutes": round((now.timestamp() - started) / 60, 1),
        "machine": machine(),
        "command": ["python", "-m", "experiments.nplus_gold.run", *sys.argv[1:]],
        "profile": profile,
        "budget": budget,
        "stages": stages,
        "reward_model": evaluation["reward_model"],
        "policies": {name: policy_summary(p, evaluation, edges) for name, p in policies.items()},
        "over_optimisation_curve": curve(policies),
        "decisions": decisions(policies, evaluation, budget["rules"]),
        "training_curves": curves,
    }


def _ci(d: dict[str, Any], key: str = "mean_diff", digits: int = 3) -> str:
    return f"{d[key]:+.{digits}f} [{d['ci_low']:+.{digits}f}, {d['ci_high']:+.{digits}f}]"


def _rate(d: dict[str, Any]) -> str:
    return f"{d['rate']:.3f} [{d['ci_low']:.3f}, {d['ci_high']:.3f}]"


def markdown(results: dict[str, Any]) -> str:
    pol, dec = results["policies"], results["decisions"]
    rm = results["reward_model"]
    lines = [f"# N+ in miniature: results ({results['created']}, profile {results['profile']}, "
             f"seed {results['budget']['seed']}, {results['minutes']} min)", "",
             f"Reward model on {rm['accuracy']['n']} held-out pairs: accuracy {_rate(rm['accuracy'])}"]
    if "agreement_with_gold" in rm:
        lines[-1] += (f"; agreement with its label source, the gold, {_rate(rm['agreement_with_gold'])} on the "
                      f"{rm['agreement_with_gold']['n']} pairs the gold orders (labels agree with it: "
                      f"{_rate(rm['labels_agreeing_with_gold'])}; pairs of the SFT policy's answers to the test posts)")
    pairs = results["stages"].get("pairs")
    for split, what in (("train", "training pairs"), ("test", "held-out pairs")):
        if pairs and split in pairs:
            p = pairs[split]
            lines += ["", f"Reward model's {what}: the SFT policy's answers to {p['posts']} {split} posts, "
                          f"{p['pairs']} pairs, {p['against_gold']} labelled against the gold, "
                          f"{p['gold_ties']} gold ties (labelled at random)."]
    r0 = dec["R0_positive_control"]
    lines += ["", "| policy | gold (recall) | proxy objective | ended | tokens | win rate vs reference | gold vs SFT | proxy vs SFT |",
              "|---|---|---|---|---|---|---|---|"]
    for name, s in pol.items():
        vs = r0 if name == r0["arm"] else dec["R1_vs_sft"].get(name)
        pv = dec["P_proxy_raised"].get(name)
        lines.append(f"| {name} | {s['gold']:.3f} | {s['proxy']:+.3f} | {s['ended']['rate']:.2f} | {s['tokens']:.1f} | "
                     f"{_rate(s['win_rate_vs_reference'])} | {_ci(vs) if vs else '-'} | {_ci(pv) if pv else '-'} |")
    rules = results["budget"]["rules"]
    lines += ["", f"Decisions (rules in report.py, parameters in budget.yaml's rules {rules}, fixed before the run):",
              f"- R0 positive control {r0['arm']} vs SFT, gold: {_ci(r0)} ({r0['interval']}): passes: {r0['passes']}"]
    for arm, c in dec["R1_vs_sft"].items():
        lines.append(f"- R1 {arm} vs SFT, gold: {_ci(c)} ({c['interval']}), sign test {c['sign_test']['positive']} to "
                     f"{c['sign_test']['negative']} (p {c['sign_test']['p_value']:.3g}), win rate {_rate(c['win_rate'])}: "
                     f"{c['verdict']}")
    for arm, c in dec["P_proxy_raised"].items():
        lines.append(f"- P {arm} raised its held-out proxy over SFT's: {_ci(c)} ({c['interval']}): {c['raised']}"
                     + ("" if c["raised"] else " (its optimiser did not raise the proxy: 'the proxy fails' not read)")
                     + f"; the proxy fails (R0 passes, proxy raised, gold not above SFT): {c['proxy_fails']}")
    lines.append(f"- R2 reward model agrees with its label source (the gold) above chance on held-out pairs "
                 f"(not D17: the judge is the labels' source): {dec['R2_learned_label_source']}")
    c = dec["R3_proxy_vs_control"]
    lines.append(f"- R3 GRPO on the proxy minus GRPO on the gold, gold: {_ci(c)} ({c['interval']})")
    r4, r5 = dec.get("R4_over_optimisation"), dec.get("R5_rise_then_fall")
    if r4:
        lines.append(f"- R4 past the KL budget, {r4['last']} vs SFT (snapshot 0): proxy {_ci(r4['proxy_last_vs_sft'])}; "
                     f"gold {_ci(r4['gold_last_vs_sft'])}; over-optimisation shown: {r4['shown']}")
    if r5:
        lines.append(f"- R5 rise then fall: gold {r5['rise_at']} vs SFT {_ci(r5['gold_rise_vs_sft'])}; "
                     f"{r5['last']} vs {r5['rise_at']} {_ci(r5['gold_last_vs_rise'])}; shown: {r5['shown']}")
    lines += ["", "Gold win rate against the reference answers by log(policy tokens / reference tokens) "
              "(the reference's own gold is 1, so 0.5 is the ceiling: a tie for every answer that states the whole key fact):",
              "", "| policy | " + " | ".join(_bucket_name(b) for b in next(iter(pol.values()))["win_rate_vs_reference_by_length"]) + " |",
              "|---" * (1 + len(next(iter(pol.values()))["win_rate_vs_reference_by_length"])) + "|"]
    for name, s in pol.items():
        cells = [f"{b['win_rate']['rate']:.2f} (n={b['n']})" if b["n"] else "-" for b in s["win_rate_vs_reference_by_length"]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    m = results["machine"]
    lines += ["", f"Measured on {m['platform']} ({m['cpus']} CPUs, {m['torch_threads']} torch threads, load "
              f"{m['load_average_1_5_15']} at the end; torch {m['torch']}, Python {m['python']}). Stage seconds: "
              + ", ".join(f"{k} {v['seconds']:.0f}" for k, v in results["stages"].items()) + "."]
    return "\n".join(lines) + "\n"


def _bucket_name(b: dict[str, Any]) -> str:
    low = "-inf" if b["low"] == -math.inf else f"{b['low']:g}"
    high = "inf" if b["high"] == math.inf else f"{b['high']:g}"
    return f"[{low}, {high})"


def figure(results: dict[str, Any], path: Path) -> None:
    """Left: the gold (top) and the proxy (bottom) of the training rollouts against sqrt(KL), per
    run (Gao et al. 2023, Fig. 1's axes), with the held-out snapshots of the run past its KL budget.
    Right: the gold win rate against the reference answers by length ratio (N+ Fig. 8)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 6.5))
    grid = fig.add_gridspec(2, 2)
    gold_ax, proxy_ax, len_ax = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[:, 1])
    colours = {name: f"C{i}" for i, name in enumerate(results["training_curves"])}  # one colour per run, both panels
    for name, c in results["training_curves"].items():
        points = [(math.sqrt(max(k, 0.0)), g, p) for k, g, p in zip(c["kl"], c["gold"], c["proxy"]) if k is not None]
        if not points:
            continue
        x = [pt[0] for pt in points]  # each rollout's mean over its samples: noisy, so points, not a line
        gold_ax.plot(x, [pt[1] for pt in points], "o", ms=4, alpha=0.7, color=colours[name], label=name)
        if any(pt[2] is not None for pt in points):
            proxy_ax.plot(x, [pt[2] for pt in points], "o", ms=4, alpha=0.7, color=colours[name], label=name)
    snaps = {k: v for k, v in results["policies"].items() if k.startswith("grpo_past_kl@")}
    past = results["training_curves"].get("grpo_past_kl") or {"step": [], "kl": []}
    kl_at = {0: 0.0, **dict(zip(past["step"], past["kl"]))}  # SFT is snapshot 0, at KL 0 to itself
    snaps = {"grpo_past_kl@0": results["policies"]["sft"], **snaps}
    for name, s in snaps.items():
        step = int(name.split("@")[1])
        kl = kl_at.get(step - 1, kl_at.get(step)) if step else 0.0
        if kl is not None:
            for ax, value in ((gold_ax, s["gold"]), (proxy_ax, s["proxy"])):
                ax.plot([math.sqrt(max(kl, 0.0))], [value], "k*", ms=10)
                ax.annotate(f"@{step}", (math.sqrt(max(kl, 0.0)), value), textcoords="offset points", xytext=(4, 4), fontsize=7)
    gold_ax.set_ylabel("gold (key-fact recall)")
    proxy_ax.set_ylabel("proxy (reward model)")
    proxy_ax.set_xlabel("sqrt(KL to SFT), each training rollout; * snapshots of grpo_past_kl (@0: SFT)", fontsize=9)
    proxy_ax.legend(fontsize=7)
    gold_ax.legend(fontsize=7)
    # one colour per policy: a run keeps its left-panel colour, the other policies the next ones, and
    # the snapshots past the KL budget a sequential map, dashed (more policies than a colour cycle has)
    snapshots = [n for n in results["policies"] if n.startswith("grpo_past_kl@")]
    others = iter(f"C{i}" for i in range(len(colours), 10))
    shade = matplotlib.colormaps["viridis"]
    for name, s in results["policies"].items():
        buckets = [b for b in s["win_rate_vs_reference_by_length"] if b["n"]]
        centres = [(_finite(b["low"], b["high"])) for b in buckets]
        if name in snapshots:
            colour, style = shade(snapshots.index(name) / max(len(snapshots) - 1, 1)), "o--"
        else:
            colour, style = colours.get(name) or next(others, "k"), "o-"
        len_ax.plot(centres, [b["win_rate"]["rate"] for b in buckets], style, ms=3, color=colour, label=name)
    len_ax.set_xlabel("log(policy tokens / reference tokens), bucket")
    len_ax.set_ylabel("gold win rate vs the reference (ties half; ceiling 0.5)")
    len_ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _finite(low: float, high: float) -> float:
    if low == -math.inf:
        return high - 0.25
    if high == math.inf:
        return low + 0.25
    return (low + high) / 2


def write(results: dict[str, Any], evaluation: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "samples.json").write_text(json.dumps(evaluation, indent=1) + "\n")
    (out / "results.md").write_text(markdown(results))
    figure(results, out / "gold_vs_kl.png")
