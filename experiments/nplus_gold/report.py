"""Statistics, decisions, tables and the figure of the N+ miniature.

Paired comparisons over the held-out posts (`lit_rlhf.evaluation.paired`): the mean difference
with its Student-t 95% interval, the exact sign test, and the win rate (ties half) with its Wilson
interval. The decision rules, fixed before the full run (README, "N+ in miniature"):

- R1, the pipeline helps: an arm (DPO, PPO, GRPO) beats its SFT start when the interval of its
  held-out gold difference lies above 0; below 0 it is worse; otherwise no detectable difference.
- R2, the proxy learned the gold (D17): the reward model agrees with the gold on held-out pairs
  more often than chance when the Wilson interval of its agreement lies above 0.5.
- R3, the proxy's cost: GRPO on the proxy reaches less gold than GRPO on the gold itself (the
  positive control) when the interval of (proxy arm - control) lies below 0.
- R4, over-optimisation: shown when, along the run pushed past its KL budget, the proxy at the
  last snapshot is above the first snapshot's (interval above 0) while the gold at the last
  snapshot is below the best earlier snapshot's (interval below 0).
"""

from __future__ import annotations

import datetime
import json
import math
import sys
from pathlib import Path
from typing import Any

ARMS = ("dpo", "ppo", "grpo")


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


def decisions(policies: dict[str, Any], evaluation: dict[str, Any]) -> dict[str, Any]:
    gold = {name: p["gold"] for name, p in policies.items()}
    proxy = {name: p["proxy"] for name, p in policies.items()}
    out: dict[str, Any] = {"R1_vs_sft": {arm: compare(gold["sft"], gold[arm]) for arm in ARMS if arm in gold}}
    out["R1_vs_sft"]["grpo_gold"] = compare(gold["sft"], gold["grpo_gold"])
    out["sft_vs_start"] = compare(gold["start"], gold["sft"])
    agreement = evaluation["reward_model"].get("agreement_with_gold")
    out["R2_agreement_above_chance"] = None if agreement is None else agreement["ci_low"] > 0.5
    out["R3_proxy_vs_control"] = compare(gold["grpo_gold"], gold["grpo"])
    snaps = [name for name in policies if name.startswith("grpo_past_kl@")]
    if len(snaps) >= 2:
        first, last = snaps[0], snaps[-1]
        best = max(snaps[:-1], key=lambda s: sum(gold[s]))
        proxy_rise, gold_drop = compare(proxy[first], proxy[last]), compare(gold[best], gold[last])
        out["R4_over_optimisation"] = {"first": first, "last": last, "best_earlier_gold": best,
                                       "proxy_last_vs_first": proxy_rise, "gold_last_vs_best_earlier": gold_drop,
                                       "shown": proxy_rise["interval"] == "above 0" and gold_drop["interval"] == "below 0"}
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
        "decisions": decisions(policies, evaluation),
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
        lines[-1] += (f"; agreement with the gold {_rate(rm['agreement_with_gold'])} on the "
                      f"{rm['agreement_with_gold']['n']} pairs the gold orders (labels agree with it: "
                      f"{_rate(rm['labels_agreeing_with_gold'])})")
    lines += ["", "| policy | gold (recall) | proxy objective | ended | tokens | win rate vs reference | gold vs SFT |",
              "|---|---|---|---|---|---|---|"]
    for name, s in pol.items():
        vs = dec["R1_vs_sft"].get(name)
        lines.append(f"| {name} | {s['gold']:.3f} | {s['proxy']:+.3f} | {s['ended']['rate']:.2f} | {s['tokens']:.1f} | "
                     f"{_rate(s['win_rate_vs_reference'])} | {_ci(vs) if vs else '-'} |")
    lines += ["", "Decisions (rules in report.py, fixed before the run):"]
    for arm, c in dec["R1_vs_sft"].items():
        lines.append(f"- R1 {arm} vs SFT, gold: {_ci(c)} ({c['interval']}), sign test {c['sign_test']['positive']} to "
                     f"{c['sign_test']['negative']} (p {c['sign_test']['p_value']:.3g}), win rate {_rate(c['win_rate'])}")
    lines.append(f"- R2 reward model agrees with the gold above chance: {dec['R2_agreement_above_chance']}")
    c = dec["R3_proxy_vs_control"]
    lines.append(f"- R3 GRPO on the proxy minus GRPO on the gold, gold: {_ci(c)} ({c['interval']})")
    r4 = dec.get("R4_over_optimisation")
    if r4:
        lines.append(f"- R4 past the KL budget: proxy {r4['last']} vs {r4['first']} {_ci(r4['proxy_last_vs_first'])}; "
                     f"gold {r4['last']} vs {r4['best_earlier_gold']} {_ci(r4['gold_last_vs_best_earlier'])}; "
                     f"over-optimisation shown: {r4['shown']}")
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
    curve = results["training_curves"].get("grpo_past_kl") or {"step": [], "kl": []}
    kl_at = dict(zip(curve["step"], curve["kl"]))
    for name, s in snaps.items():
        step = int(name.split("@")[1])
        kl = kl_at.get(step - 1, kl_at.get(step))
        if kl is not None:
            for ax, value in ((gold_ax, s["gold"]), (proxy_ax, s["proxy"])):
                ax.plot([math.sqrt(max(kl, 0.0))], [value], "k*", ms=10)
                ax.annotate(f"@{step}", (math.sqrt(max(kl, 0.0)), value), textcoords="offset points", xytext=(4, 4), fontsize=7)
    gold_ax.set_ylabel("gold (key-fact recall)")
    proxy_ax.set_ylabel("proxy (reward model)")
    proxy_ax.set_xlabel("sqrt(KL to the SFT policy) of each training rollout; * held-out snapshots of grpo_past_kl")
    proxy_ax.legend(fontsize=7)
    gold_ax.legend(fontsize=7)
    for name, s in results["policies"].items():
        buckets = [b for b in s["win_rate_vs_reference_by_length"] if b["n"]]
        centres = [(_finite(b["low"], b["high"])) for b in buckets]
        len_ax.plot(centres, [b["win_rate"]["rate"] for b in buckets], "o-", ms=3, label=name)
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
