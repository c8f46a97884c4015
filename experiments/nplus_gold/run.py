"""The N+ pipeline in miniature, measured by a programmatic gold it never sees.

    python -m experiments.nplus_gold.run --profile full --set seed=3 --out outputs/nplus_gold/seed3

SmolLM2-135M-Instruct and the bundled `keyfact_chat` posts; the preference pairs are the SFT
policy's own answers labelled by the key-fact gold through Bradley-Terry noise (Gao et al. 2023's
synthetic-gold set-up, sampled as `lit_rlhf/data/bundled/make_keyfact_chat.py` sampled the bundled
pairs from the starting policy). Stages
(`stages/*.yaml`, each run as `main.py fit --config` would, with the library's modules):

1. `sft`: SFT on the reference answers (N+: every later stage starts from the SFT policy);
2. `pairs` (not a CLI stage, `pairs.py`): the SFT policy answers the training posts and its answers
   are paired and labelled by the gold through Bradley-Terry noise (N+ samples the comparisons
   from its SFT policies), written to `<out>/pairs/train.jsonl` (and the same on the held-out
   posts, `test.jsonl`, for the reward model's held-out accuracy);
3. `reward`: the proxy reward model, from the SFT model, on those pairs (D15 normalised);
4. `dpo`: DPO from SFT on the same pairs; `ppo`, `grpo`: online RL from SFT against the proxy,
   the gold logged on every rollout with weight 0 (never optimised);
5. `grpo_gold`: the positive control, GRPO with the gold itself as the reward;
6. `grpo_past_kl`: GRPO pushed past its KL budget (almost no penalty, three times the episodes),
   saved every `rules.snapshot_every` rollouts; SFT is its snapshot 0.

Then `evaluate.py` answers the held-out test posts greedily with every policy (the start, SFT,
each arm, each snapshot) and scores each answer by the proxy and the gold; `report.py` writes
`results.json` (every interval and decision), `samples.json` (every answer and score),
`results.md` and `gold_vs_kl.png`. Every budget knob, and the decision rules, are in `budget.yaml`.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import time
from pathlib import Path
from typing import Any, Sequence

import yaml

from experiments.overrides import parse_set

HERE = Path(__file__).resolve().parent
STAGES_DIR = HERE / "stages"
STAGES = ("sft", "reward", "dpo", "ppo", "grpo", "grpo_gold", "grpo_past_kl")  # the CLI stages; `pairs` runs after sft
ORDER = ("sft", "pairs", *STAGES[1:])  # the order the driver runs them in
RULES = ("snapshot_every", "rise_at", "control")
BASE_MODEL = "smollm2-135m-instruct"  # the stage YAMLs' model; a profile may swap it
PLACEHOLDER = "outputs/nplus_gold"  # the stage YAMLs' output root; rewritten to --out


def load_budget(profile: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The knobs of one profile of `budget.yaml`, with `overrides` (unknown keys refused)."""
    profiles = yaml.safe_load((HERE / "budget.yaml").read_text())
    if profile not in profiles:
        raise ValueError(f"unknown profile {profile!r}; budget.yaml has {sorted(profiles)}")
    budget = copy.deepcopy(profiles[profile])
    for key, value in (overrides or {}).items():
        if key not in budget:
            raise ValueError(f"unknown budget knob {key!r}; known: {sorted(budget)}")
        budget[key] = value
    unknown = set(budget["stage_overrides"]) - set(STAGES)
    if unknown:
        raise ValueError(f"stage_overrides names unknown stages {sorted(unknown)}; stages: {STAGES}")
    if set(budget["rules"]) != set(RULES):
        raise ValueError(f"rules must name exactly {RULES}, got {sorted(budget['rules'])}")
    every, rise = budget["rules"]["snapshot_every"], budget["rules"]["rise_at"]
    if every < 1 or rise < every or rise % every:
        raise ValueError(f"rules.rise_at ({rise}) must be a snapshot: a positive multiple of snapshot_every ({every})")
    return budget


def _rewrite(value: Any, out: Path, model: str) -> Any:
    if isinstance(value, dict):
        return {k: _rewrite(v, out, model) for k, v in value.items()}
    if isinstance(value, list):
        return [_rewrite(v, out, model) for v in value]
    if isinstance(value, str) and value.startswith(PLACEHOLDER):
        return str(out) + value[len(PLACEHOLDER):]
    if value == BASE_MODEL:
        return model
    return value


def set_dotted(config: dict[str, Any], key: str, value: Any) -> None:
    """config[a][b][2][c] = value for key "a.b.2.c" (a list index where the node is a list)."""
    *path, last = key.split(".")
    node: Any = config
    for part in path:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def stage_config(stage: str, budget: dict[str, Any], out: Path) -> dict[str, Any]:
    """The stage's YAML with its outputs under `out`, the profile's model and seed, and its overrides."""
    config = _rewrite(yaml.safe_load((STAGES_DIR / f"{stage}.yaml").read_text()), out, budget["model"])
    config["seed_everything"] = budget["seed"]
    snapshot = snapshot_callback(config)
    if snapshot is not None:
        snapshot["every_n_train_steps"] = budget["rules"]["snapshot_every"]
    for key, value in (budget["stage_overrides"].get(stage) or {}).items():
        set_dotted(config, key, value)
    return config


def snapshot_callback(config: dict[str, Any]) -> dict[str, Any] | None:
    """The init_args of a stage's snapshot callback (a ModelCheckpoint saving every n steps), if any."""
    for cb in config["trainer"].get("callbacks") or []:
        args = cb.get("init_args") or {}
        if cb["class_path"].endswith("ModelCheckpoint") and args.get("every_n_train_steps"):
            return args
    return None


def resume_checkpoints(config: dict[str, Any]) -> list[Path]:
    """A stage's resume checkpoints (`last.ckpt` of its ModelCheckpoint callbacks that keep the last),
    not its snapshots."""
    return [Path(cb["init_args"]["dirpath"]) / "last.ckpt" for cb in config["trainer"].get("callbacks") or []
            if cb["class_path"].endswith("ModelCheckpoint") and (cb.get("init_args") or {}).get("save_last")
            and not cb["init_args"].get("every_n_train_steps")]


def pairs_dir(out: Path) -> Path:
    return out / "pairs"


def export_dir(config: dict[str, Any]) -> Path:
    return Path(config["model"]["init_args"]["export_dir"])


def log_dir(config: dict[str, Any]) -> Path:
    args = config["trainer"]["logger"]["init_args"]
    return Path(args["save_dir"]) / args["name"] / str(args.get("version") or "")


def run_stage(stage: str, config: dict[str, Any], out: Path, log) -> float:
    """Fit one stage through the CLI (in this process); returns its wall seconds."""
    from callbacks import default_callbacks
    from lit_rlhf.cli import main as cli_main

    path = out / "configs" / f"{stage}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    log(f"== {stage}: main.py fit --config {path}")
    start = time.perf_counter()
    cli_main(["fit", "--config", str(path)], run=True, default_callbacks=default_callbacks)  # as main.py
    seconds = time.perf_counter() - start
    log(f"   {stage} done in {seconds:.0f} s")
    return seconds


def snapshots(config: dict[str, Any]) -> list[Path]:
    """The weight-only checkpoints of a stage's snapshot callback, in step order."""
    args = snapshot_callback(config)
    if args is None:
        return []
    found = list(Path(args["dirpath"]).glob("step*.ckpt"))
    return sorted(found, key=lambda p: int(p.stem[len("step"):]))


def run(profile: str = "full", out: str | Path = "outputs/nplus_gold", overrides: dict[str, Any] | None = None,
        skip_done: bool = False, log=print, keep_checkpoints: bool = False) -> dict[str, Any]:
    from experiments.nplus_gold import evaluate, pairs, report

    budget = load_budget(profile, overrides)
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(budget["threads"])
    started = time.time()
    record_path = out / "stages.json"
    records: dict[str, Any] = json.loads(record_path.read_text()) if skip_done and record_path.is_file() else {}
    configs = {stage: stage_config(stage, budget, out) for stage in STAGES}
    for stage in ORDER:
        if stage == "pairs":  # the SFT policy's answers, gold-labelled: the reward and dpo stages' data
            if skip_done and stage in records and all((pairs_dir(out) / f"{s}.jsonl").is_file() for s in pairs.SPLITS):
                log(f"== pairs: done before ({pairs_dir(out)}), kept")
                continue
            log(f"== pairs: the SFT policy answers the training and the held-out posts ({pairs_dir(out)})")
            start = time.perf_counter()
            records[stage] = {split: pairs.make_pairs(str(export_dir(configs["sft"])), budget, pairs_dir(out),
                                                      budget["seed"] + k, log, split)
                              for k, split in enumerate(pairs.SPLITS)}
            records[stage]["seconds"] = round(time.perf_counter() - start, 1)
        elif skip_done and stage in records and (export_dir(configs[stage]) / "config.json").is_file():
            log(f"== {stage}: done before ({export_dir(configs[stage])}), kept")
            continue
        else:
            records[stage] = {"seconds": round(run_stage(stage, configs[stage], out, log), 1)}
            if not keep_checkpoints:  # the stage is exported: its resume state (1.5-3 GB at 135M) is not read again
                for path in resume_checkpoints(configs[stage]):
                    path.unlink(missing_ok=True)
        record_path.write_text(json.dumps(records, indent=1) + "\n")
        if budget["collect_garbage"]:
            gc.collect()
    policies = {"start": budget["model"], **{s: str(export_dir(configs[s])) for s in STAGES if s != "reward"}}
    past = snapshots(configs["grpo_past_kl"])
    policies.pop("grpo_past_kl")
    policies.update({f"grpo_past_kl@{p.stem[len('step'):]}": str(p) for p in past})
    log(f"== evaluation of {len(policies)} policies on {budget['eval_prompts']} held-out posts")
    evaluation = evaluate.evaluate(policies, str(export_dir(configs["reward"])), budget, str(pairs_dir(out)), log=log)
    curves = {s: evaluate.training_curves(log_dir(configs[s])) for s in ("ppo", "grpo", "grpo_gold", "grpo_past_kl")}
    results = report.build(budget, profile, records, evaluation, curves, started=started)
    report.write(results, evaluation, out)
    log(f"== wrote {out / 'results.json'}, results.md, samples.json, gold_vs_kl.png "
        f"({(time.time() - started) / 60:.1f} min)")
    return results


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="full", help="a profile of budget.yaml (full, smoke)")
    parser.add_argument("--out", default="outputs/nplus_gold")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override budget knobs (YAML values)")
    parser.add_argument("--skip_done", action="store_true",
                        help="keep the stages a previous run in --out finished (their export exists)")
    parser.add_argument("--keep_checkpoints", action="store_true",
                        help="keep each finished stage's resume checkpoint (last.ckpt; by default deleted once the "
                             "stage's model is exported: 12 of the 20 GB a seed's directory held at 135M)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return run(args.profile, args.out, parse_set(args.set), args.skip_done, keep_checkpoints=args.keep_checkpoints)


if __name__ == "__main__":
    main()
