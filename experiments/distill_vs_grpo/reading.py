"""The reading of the distillation-vs-GRPO experiment, from its saved files alone.

    python -m experiments.distill_vs_grpo.reading experiments/distill_vs_grpo/results

Reads `teacher.json`, `select/choice.json` and `runs/{grpo,distill}_s*.json` (written by
`run.py`), writes `reading.json` and `reading.md` beside them and puts `reading.md` into the
experiment README's block `<!-- reading:distill_vs_grpo -->` (`--no-readme` leaves it alone).

Only seeds with both arms' files count (the comparison is paired seed by seed and problem by
problem). Decision rule (fixed before the reported runs, README): the paired difference
distill - grpo in held-out greedy accuracy at step 8, over seeds x problems, with its 95%
hierarchical bootstrap interval (seeds, then problems; `lit_rlhf.evaluation.paired`): above 0,
distillation is faster; below 0, GRPO is; else no difference shown. Secondary: the first
checkpoint at which each arm's mean accuracy reaches the teacher's on the same problems.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from lit_rlhf.evaluation.paired import bootstrap_mean, paired_bootstrap, sign_test

HERE = Path(__file__).resolve().parent
PRIMARY_STEP = 8
VERDICTS = {"improved": "distillation faster", "regressed": "GRPO faster",
            "no detectable change": "no difference shown"}
MARK = "reading:distill_vs_grpo"


def _grid(runs: dict[int, dict], step: str) -> list[list[float]]:
    return [[float(c) for c in runs[s]["checkpoints"][step]["correct"]] for s in sorted(runs)]


def _interval(b) -> dict[str, Any]:
    return {"mean": b.mean, "ci_low": b.ci_low, "ci_high": b.ci_high, "p_value": b.p_value}


def read(out: Path, primary_step: int = PRIMARY_STEP) -> dict[str, Any]:
    out = Path(out)
    teacher = json.loads((out / "teacher.json").read_text())
    choice_path = out / "select" / "choice.json"
    choice = json.loads(choice_path.read_text()) if choice_path.exists() else None
    runs: dict[str, dict[int, dict]] = {"grpo": {}, "distill": {}}
    for path in sorted((out / "runs").glob("*_s*.json")):
        record = json.loads(path.read_text())
        runs[record["arm"]][record["seed"]] = record
    seeds = sorted(set(runs["grpo"]) & set(runs["distill"]))
    paired = {arm: {s: runs[arm][s] for s in seeds} for arm in runs}
    # the teacher may have been scored on more problems than the runs (a longer evaluation split): its
    # first n, checked against the runs' references below
    n = len(next(iter(runs["grpo"].values()))["checkpoints"]["0"]["correct"]) if runs["grpo"] else None
    teacher_correct = [float(c) for c in teacher["test"]["correct"][:n]]
    teacher_acc = sum(teacher_correct) / len(teacher_correct)
    teacher_answers = teacher["test"]["answers"][:n]
    result: dict[str, Any] = {
        "seeds": seeds, "unpaired_runs": sorted(f"{a}_s{s}" for a in runs for s in runs[a] if s not in seeds),
        "teacher": {"path": teacher["policy"], "split": next(iter(runs["grpo"].values()))["split"] if runs["grpo"] else teacher["eval_split"],
                    "n": len(teacher_correct),
                    "accuracy": teacher_acc,
                    "val_accuracy": sum(teacher["val"]["correct"]) / len(teacher["val"]["correct"]) if teacher["val"] else None},
        "selection": choice, "primary_step": primary_step,
    }
    if not seeds:
        return {**result, "steps": [], "arms": {}, "differences": {}, "primary": None, "reaches_teacher": {}}
    steps = sorted({int(s) for arm in paired for r in paired[arm].values() for s in r["checkpoints"]})
    steps = [s for s in steps if all(str(s) in r["checkpoints"] for arm in paired for r in paired[arm].values())]
    first = paired["grpo"][seeds[0]]
    for arm in paired:
        for s in seeds:
            if paired[arm][s]["checkpoints"]["0"]["references"] != first["checkpoints"]["0"]["references"]:
                raise ValueError(f"{arm} seed {s} was evaluated on other problems than grpo seed {seeds[0]}")
    if teacher["test"]["references"][:len(teacher_correct)] != first["checkpoints"]["0"]["references"]:
        raise ValueError("the teacher was evaluated on other problems than the runs")
    arms: dict[str, Any] = {}
    for arm in paired:
        arms[arm] = {"lr": paired[arm][seeds[0]]["lr"], "steps": {}, "wall_seconds": [paired[arm][s]["wall_seconds"] for s in seeds],
                     # the task reward of the student's own samples (temperature 1, training questions), per seed: the
                     # mean over its steps (distill: logged only, not trained on)
                     "train_score": [sum(paired[arm][s]["train_scores"]) / max(1, len(paired[arm][s]["train_scores"]))
                                     for s in seeds]}
        for step in steps:
            grid = _grid(paired[arm], str(step))
            arms[arm]["steps"][str(step)] = {
                **_interval(bootstrap_mean(grid)), "per_seed": [sum(row) / len(row) for row in grid],
                "samples": paired[arm][seeds[0]]["checkpoints"][str(step)]["samples"],
                "vs_teacher": _interval(paired_bootstrap(grid, [teacher_correct])),
                # the share of problems whose greedy answer is the teacher's, text for text (mean over seeds)
                "same_answer_as_teacher": sum(
                    sum(a == b for a, b in zip(paired[arm][s]["checkpoints"][str(step)]["answers"], teacher_answers))
                    / len(teacher_answers) for s in seeds) / len(seeds)}
        reached = [s for s in steps if arms[arm]["steps"][str(s)]["mean"] >= teacher_acc]
        per_seed = {str(seed): next((s for s in steps if arms[arm]["steps"][str(s)]["per_seed"][i] >= teacher_acc), None)
                    for i, seed in enumerate(seeds)}
        arms[arm]["reaches_teacher"] = {"pooled": reached[0] if reached else None, "per_seed": per_seed}
    differences = {}
    for step in steps:
        d = paired_bootstrap(_grid(paired["distill"], str(step)), _grid(paired["grpo"], str(step)))
        per_problem = [sum(col) / len(col) for col in zip(*[[a - b for a, b in zip(ra, rb)] for ra, rb in
                                                              zip(_grid(paired["distill"], str(step)),
                                                                  _grid(paired["grpo"], str(step)))])]
        sign = sign_test(per_problem)
        differences[str(step)] = {**_interval(d), "verdict": VERDICTS[d.verdict],
                                  "problems_distill_ahead": sign.positive, "problems_grpo_ahead": sign.negative,
                                  "sign_test_p": sign.p_value,
                                  "per_seed": [a - b for a, b in zip(arms["distill"]["steps"][str(step)]["per_seed"],
                                                                     arms["grpo"]["steps"][str(step)]["per_seed"])]}
    primary = None
    if str(primary_step) in differences:
        primary = {"step": primary_step, "samples": arms["grpo"]["steps"][str(primary_step)]["samples"],
                   "difference": differences[str(primary_step)], "verdict": differences[str(primary_step)]["verdict"]}
    return {**result, "steps": steps, "arms": arms, "differences": differences, "primary": primary,
            "reaches_teacher": {arm: arms[arm]["reaches_teacher"] for arm in arms}}


def _ci(d: dict[str, Any], sign: bool = False) -> str:
    f = "+.3f" if sign else ".3f"
    return f"{d['mean']:{f}} [{d['ci_low']:{f}}, {d['ci_high']:{f}}]"


def render(result: dict[str, Any], decision: bool = True) -> str:
    """The reading as Markdown; `decision` False: the rule's line is labelled as not the decision
    (a supplementary run directory)."""
    t = result["teacher"]
    lines = []
    if not result["seeds"]:
        return f"No seed has both arms' runs yet. Teacher ({t['path']}): greedy accuracy {t['accuracy']:.3f} on {t['n']} problems."
    lines += ["| step | student samples | grpo | distill | distill - grpo (problems distill ahead : grpo ahead, sign test p) "
              "| per-seed differences | verdict |", "|---|---|---|---|---|---|---|"]
    for step in result["steps"]:
        g, d = result["arms"]["grpo"]["steps"][str(step)], result["arms"]["distill"]["steps"][str(step)]
        diff = result["differences"][str(step)]
        mark = "**" if step == result["primary_step"] else ""
        lines.append(f"| {mark}{step}{mark} | {g['samples']} | {_ci(g)} | {_ci(d)} | {mark}{_ci(diff, True)}{mark} "
                     f"({diff['problems_distill_ahead']} : {diff['problems_grpo_ahead']}, p={diff['sign_test_p']:.2g}) | "
                     + " ".join(f"{x:+.3f}" for x in diff["per_seed"]) + f" | {diff['verdict']} |")
    last = str(result["steps"][-1])
    reach = result["reaches_teacher"]

    def _reach(arm: str) -> str:
        r = reach[arm]
        pooled = f"step {r['pooled']}" if r["pooled"] is not None else f"not by step {last}"
        seeds = ", ".join(f"seed {s}: {'step ' + str(v) if v is not None else 'no'}" for s, v in r["per_seed"].items())
        return f"{pooled} ({seeds})"

    sel = result["selection"]
    sel_text = (f"distill's lr {sel['lr']:g}, chosen from {', '.join(f'{x:g}' for x in sel['grid'])} on the validation "
                f"split with seed {sel['seed']} (mean validation accuracy after step 0: "
                + ", ".join(f"{k} {v:.3f}" for k, v in sel["mean_val_accuracy_after_step_0"].items()) + ")"
                if sel else f"distill lr {result['arms']['distill']['lr']:g}, grpo's (no selection run; README)")
    lines += ["", f"Greedy accuracy on {t['n']} held-out problems ({t['split']}), mean [95% hierarchical bootstrap interval, "
              f"seeds then problems, 10000 resamples] over seeds {', '.join(map(str, result['seeds']))}; differences paired "
              "seed by seed and problem by problem; the sign test on per-problem differences averaged over seeds. "
              f"Student samples: 24 per step in both arms. grpo lr {result['arms']['grpo']['lr']:g} (shipped); {sel_text}.",
              "",
              f"Teacher ({t['path']}): {t['accuracy']:.3f} on these problems"
              + (f" ({t['val_accuracy']:.3f} on validation). " if t["val_accuracy"] is not None else ". ")
              + 
              f"At step {last}: grpo - teacher {_ci(result['arms']['grpo']['steps'][last]['vs_teacher'], True)}, "
              f"distill - teacher {_ci(result['arms']['distill']['steps'][last]['vs_teacher'], True)}. "
              f"First checkpoint whose mean reaches the teacher's score: grpo {_reach('grpo')}; distill {_reach('distill')}.",
              ""]
    p = result["primary"]
    if p:
        head = ("**Decision (the rule fixed before the runs)" if decision
                else "**The rule applied to these supplementary runs (not the decision)")
        lines.append(f"{head}: at step {p['step']} ({p['samples']} student samples), "
                     f"distill - grpo = {_ci(p['difference'], True)}: {p['verdict']}.**")
    else:
        lines.append(f"**Decision: step {result['primary_step']} was not reached by every paired run: no decision.**")
    if result["unpaired_runs"]:
        lines.append(f"Runs without their pair (not counted): {', '.join(result['unpaired_runs'])}.")
    wall = {arm: sum(a["wall_seconds"]) / len(a["wall_seconds"]) for arm, a in result["arms"].items()}
    same = {arm: ", ".join(f"{a['steps'][str(s)]['same_answer_as_teacher']:.2f}" for s in result["steps"])
            for arm, a in result["arms"].items()}
    lines.append(f"Share of problems whose greedy answer is the teacher's, word for word, at steps "
                 f"{', '.join(map(str, result['steps']))}: grpo {same['grpo']}; distill {same['distill']}.")
    score = {arm: a["train_score"] for arm, a in result["arms"].items()}
    lines.append("Task reward of the student's own training samples (temperature 1, the same training questions in "
                 "both arms; distill does not train on it), mean over steps, per seed: grpo "
                 + " ".join(f"{x:.3f}" for x in score["grpo"]) + "; distill " + " ".join(f"{x:.3f}" for x in score["distill"]) + ".")
    lines.append(f"Mean wall time per run (training and {len(result['steps']) - 1} evaluations, with other jobs on "
                 f"the machine): grpo {wall['grpo'] / 60:.1f} min, distill {wall['distill'] / 60:.1f} min.")
    return "\n".join(lines)


def _pattern(mark: str = MARK) -> re.Pattern[str]:
    return re.compile(rf"(<!-- {re.escape(mark)} -->\n)(.*?\n)?(<!-- /{re.escape(mark)} -->)", re.S)


def block(text: str, mark: str = MARK) -> str | None:
    """The README block's body, without its final newline."""
    m = _pattern(mark).search(text)
    return None if m is None else (m.group(2) or "").rstrip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, nargs="?", default=HERE / "results")
    parser.add_argument("--readme", type=Path, default=HERE / "README.md")
    parser.add_argument("--no-readme", action="store_true")
    parser.add_argument("--block", default=MARK, help="the README block to write (another run directory's)")
    parser.add_argument("--supplementary", action="store_true", help="not the decision's runs: say so")
    args = parser.parse_args(argv)
    result = read(args.out)
    text = render(result, decision=not args.supplementary)
    (args.out / "reading.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "reading.md").write_text(text + "\n")
    if not args.no_readme:
        readme = args.readme.read_text()
        if block(readme, args.block) is None:
            raise SystemExit(f"{args.readme} has no block <!-- {args.block} --> ... <!-- /{args.block} -->")
        args.readme.write_text(_pattern(args.block).sub(lambda m: m.group(1) + text + "\n" + m.group(3), readme))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
