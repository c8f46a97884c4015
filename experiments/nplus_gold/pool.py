"""The N+ miniature read over its seeds: each rule's outcome per seed, and the golds pooled.

    python -m experiments.nplus_gold.pool experiments/nplus_gold/results/seed{3,4,5} \
        --out experiments/nplus_gold/results/pooled --readme experiments/README.md

A claim is read by its rule on every seed (README, "N+ in miniature"): replicated when the rule
holds on every seed, not replicated when it holds on none, mixed otherwise, and "not read" on a
seed where the rule withholds its verdict (R1 where the positive control failed). Beside the
tally, the gold and proxy differences from SFT pooled over seeds x held-out posts by the
hierarchical bootstrap (`lit_rlhf.evaluation.paired.paired_bootstrap`: seeds, then posts), a
description of the spread over seeds that no rule reads. Last, a secondary reading chosen after
the runs (post hoc): the project's key-fact F1 (`lit_rlhf.judges.keyfact.keyfact_f1`) of each
policy's saved answers minus SFT's, per seed and pooled. The gold, key-fact recall, pays for
copying the post; F1 also charges for the words beyond the fact.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

from experiments.nplus_gold.report import ARMS, ONLINE, compare
from experiments.readme_block import render_into


def outcomes(decisions: dict[str, Any]) -> dict[str, bool | None]:
    """One seed's decisions as {claim: True (rule holds), False, None (not read)}."""
    out: dict[str, bool | None] = {"R0 positive control beats SFT": decisions["R0_positive_control"]["passes"]}
    for arm, c in decisions["R1_vs_sft"].items():
        out[f"R1 {arm} beats SFT"] = None if c["verdict"].startswith("not read") else c["verdict"] == "beats SFT"
    for arm, c in decisions["P_proxy_raised"].items():
        out[f"P {arm} raised its proxy"] = c["raised"]
        out[f"P {arm}: the proxy fails"] = c["proxy_fails"]
    out["R2 learned its label source"] = decisions["R2_learned_label_source"]
    out["R3 the proxy costs gold"] = decisions["R3_proxy_vs_control"]["interval"] == "below 0"
    for key, name in (("R4_over_optimisation", "R4 over-optimisation"), ("R5_rise_then_fall", "R5 rise then fall")):
        out[name] = decisions[key]["shown"] if key in decisions else None
    return out


def reading(values: Sequence[bool | None]) -> str:
    """The cross-seed reading of one claim from its per-seed outcomes."""
    if any(v is None for v in values):
        return "not read on every seed"
    if all(values):
        return "replicated"
    return "not replicated" if not any(values) else "mixed"


def tally(per_seed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """{seed name: decisions} -> {claim: {"seeds": {seed: outcome}, "reading": ...}}."""
    by_seed = {seed: outcomes(d) for seed, d in per_seed.items()}
    claims = list(next(iter(by_seed.values())))
    return {claim: {"seeds": {seed: o.get(claim) for seed, o in by_seed.items()},
                    "reading": reading([o.get(claim) for o in by_seed.values()])} for claim in claims}


def pooled(samples: list[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Gold and proxy of each policy in `names` minus SFT's, over seeds x posts (hierarchical bootstrap)."""
    from lit_rlhf.evaluation.paired import paired_bootstrap

    out = {}
    for name in names:
        out[name] = {m: paired_bootstrap([s["policies"][name][m] for s in samples],
                                         [s["policies"]["sft"][m] for s in samples]).as_dict() for m in ("gold", "proxy")}
    return out


def with_f1(sample: dict[str, Any]) -> dict[str, Any]:
    """`sample` with each policy's key-fact F1 per post (`f1`), from its saved answers."""
    from lit_rlhf.judges.keyfact import keyfact_f1

    for policy in sample["policies"].values():
        policy["f1"] = [keyfact_f1(text, ref) for text, ref in zip(policy["texts"], sample["references"])]
    return sample


def f1_vs_sft(seeds: Sequence[str], samples: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Each policy's key-fact F1 minus SFT's on each seed (paired over posts) and pooled (post hoc)."""
    from lit_rlhf.evaluation.paired import paired_bootstrap

    out = {}
    for name in names:
        out[name] = {seed: {k: c[k] for k in ("mean_diff", "ci_low", "ci_high", "interval")}
                     for seed, s in zip(seeds, samples)
                     for c in [compare(s["policies"]["sft"]["f1"], s["policies"][name]["f1"])]}
        out[name]["pooled"] = paired_bootstrap([s["policies"][name]["f1"] for s in samples],
                                               [s["policies"]["sft"]["f1"] for s in samples]).as_dict()
    return out


def per_seed(seeds: Sequence[str], samples: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Each policy's gold and length on each seed, and its gold and proxy minus SFT's (paired over
    the held-out posts, as `report.compare`)."""
    out: dict[str, Any] = {}
    for name in ["start", "sft", *names]:
        out[name] = {}
        for seed, s in zip(seeds, samples):
            row = {k: sum(s["policies"][name][k]) / len(s["policies"][name][k]) for k in ("gold", "tokens")}
            if name not in ("start", "sft"):
                for m in ("gold", "proxy"):
                    c = compare(s["policies"]["sft"][m], s["policies"][name][m])
                    row[f"{m}_vs_sft"] = {k: c[k] for k in ("mean_diff", "ci_low", "ci_high", "interval")}
            out[name][seed] = row
    return out


def pool(dirs: Sequence[Path]) -> dict[str, Any]:
    results = {d.name: json.loads((d / "results.json").read_text()) for d in dirs}
    samples = [with_f1(json.loads((d / "samples.json").read_text())) for d in dirs]
    curves = {name: r["over_optimisation_curve"] for name, r in results.items()}
    if len({tuple(c) for c in curves.values()}) != 1:
        raise ValueError(f"the seeds' snapshots differ: {curves}")
    first = next(iter(results.values()))
    rise_at = first["decisions"]["R5_rise_then_fall"]["rise_at"]
    names = [*ARMS, first["budget"]["rules"]["control"], rise_at, first["over_optimisation_curve"][-1]]
    return {"seeds": {name: r["budget"]["seed"] for name, r in results.items()}, "online_arms": list(ONLINE),
            "claims": tally({name: r["decisions"] for name, r in results.items()}),
            "per_seed": per_seed(list(results), samples, names), "pooled_vs_sft": pooled(samples, names),
            "f1_vs_sft_post_hoc": f1_vs_sft(list(results), samples, names)}


def markdown(p: dict[str, Any]) -> str:
    return f"# N+ in miniature over seeds {', '.join(str(s) for s in p['seeds'].values())}\n\n" + tables(p)


def _diff(d: dict[str, Any] | None) -> str:
    """A paired difference with its interval, bold where the interval excludes 0."""
    if d is None:
        return ""
    text = f"{d['mean_diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"
    return text if d["interval"] == "contains 0" else f"**{text}**"


def tables(p: dict[str, Any]) -> str:
    """Each seed's policies against SFT, the claims' tally and the pooled differences (the README's
    `<!-- reading:nplus_pooled -->` block)."""
    seeds = list(p["seeds"])
    short = "/".join(f"s{n}" for n in p["seeds"].values())
    lines = [f"| policy | gold, {short} | tokens, {short} | "
             + " | ".join(f"{m} vs SFT, {seed}" for m in ("gold", "proxy") for seed in seeds) + " |",
             "|---" * (3 + 2 * len(seeds)) + "|"]
    for name, rows in p["per_seed"].items():
        diffs = [_diff(r.get(f"{m}_vs_sft")) for m in ("gold", "proxy") for r in rows.values()]
        lines.append(f"| {name} | " + " / ".join(f"{r['gold']:.3f}" for r in rows.values()) + " | "
                     + " / ".join(f"{r['tokens']:.1f}" for r in rows.values()) + " | " + " | ".join(diffs) + " |")
    lines += ["", "Each claim's rule on each seed (yes: the rule holds; -: not read) and its reading over the seeds:", "",
              "| claim | " + " | ".join(seeds) + " | reading |", "|---" * (len(seeds) + 2) + "|"]
    for claim, c in p["claims"].items():
        cells = ["-" if v is None else "yes" if v else "no" for v in c["seeds"].values()]
        lines.append(f"| {claim} | " + " | ".join(cells) + f" | {c['reading']} |")
    lines += ["", "Pooled over seeds x held-out posts (hierarchical bootstrap; descriptive, no rule reads it):", "",
              "| policy - SFT | gold [95% CI] | proxy [95% CI] |", "|---|---|---|"]
    for name, d in p["pooled_vs_sft"].items():
        lines.append(f"| {name} | " + " | ".join(
            f"{d[m]['mean']:+.3f} [{d[m]['ci_low']:+.3f}, {d[m]['ci_high']:+.3f}]" for m in ("gold", "proxy")) + " |")
    lines += ["", "Secondary, chosen after the runs (post hoc): key-fact F1 minus SFT's, per seed (paired over posts) "
              "and pooled over seeds x posts:", "",
              "| policy - SFT | " + " | ".join(f"F1, {seed}" for seed in seeds) + " | F1, pooled |",
              "|---" * (len(seeds) + 2) + "|"]
    for name, d in p.get("f1_vs_sft_post_hoc", {}).items():
        pooled_f1 = d["pooled"]
        lines.append(f"| {name} | " + " | ".join(_diff(d[seed]) for seed in seeds)
                     + f" | {pooled_f1['mean']:+.3f} [{pooled_f1['ci_low']:+.3f}, {pooled_f1['ci_high']:+.3f}] |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=Path, help="one result directory per seed")
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.md")
    parser.add_argument("--readme", type=Path, default=None,
                        help="also put the tables into this file's <!-- reading:nplus_pooled --> block")
    args = parser.parse_args(argv)
    p = pool(args.dirs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(p, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(p))
    if args.readme:
        render_into(args.readme, "nplus_pooled", tables(p))
    print(markdown(p))
    return p


if __name__ == "__main__":
    main()
