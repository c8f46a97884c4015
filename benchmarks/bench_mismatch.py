"""The sampler/learner mismatch of the vLLM backend, measured: GRPO sampling with a colocated vLLM
engine (`rollout: VLLMSampler`) on a real model and real prompts, and the rollout-correction
diagnostics the module logs at every step (`train/rollout_correction/*`,
`lit_rlhf.losses.rollout_correction.mismatch_stats`).

    python -m benchmarks.bench_mismatch --json benchmarks/results/mismatch_vllm_cpu.json --write
    python -m benchmarks.bench_mismatch --render benchmarks/results/mismatch_vllm_cpu.json --write   # table only

Per sampling temperature: `--steps` GRPO steps of the verifiable-reward example's shape
(SmolLM2-135M-Instruct, `bundled:arithmetic`, 6 questions x 4 answers, lr 2e-5, no KL term),
the engine synced to the policy before every rollout, so the mismatch is the two engines'
numerics alone (vLLM's kernels and sampler against the learner's forward), never staleness. The
learner recomputes each sampled token's log-prob at the same temperature (`logprob_temperature`
follows `temperature`). A two-sided token mask [0.5, 2] (IcePop's form) is on, so its masked
fraction is measured too. Per step: k1 and k3 estimates of KL(sampler || learner) per token, the
token ratio pi_learner / pi_sampler's min, 5/50/95% quantiles and max, and the masked fraction.
`--write` renders the table into benchmarks/RESULTS.md (between its mismatch markers).

With `--top-p` / `--top-k` the engine samples from the filtered distribution and the learner
replays the filter on its own logits (`lit_rlhf.ops.sampling`); `--replay-off-too` adds a row per
temperature with the learner's log-probs over the full vocabulary (`OnlineModule.logprob_filter`
set to (0, 1.0)), the gap before the replay. That table has markers of its own:

    python -m benchmarks.bench_mismatch --top-p 0.9 --replay-off-too --json benchmarks/results/mismatch_vllm_cpu_top_p.json --write
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import statistics
from pathlib import Path
from typing import Any

from benchmarks.report import write_block

STATS = ("kl_k1", "kl_k3", "ratio_min", "ratio_p05", "ratio_p50", "ratio_p95", "ratio_max", "masked_fraction")
BEGIN, END = "<!-- mismatch-benchmark:begin -->", "<!-- mismatch-benchmark:end -->"
FILTER_BEGIN, FILTER_END = "<!-- mismatch-top-p-benchmark:begin -->", "<!-- mismatch-top-p-benchmark:end -->"
TITLE = "The vLLM backend's sampler/learner mismatch (`bench_mismatch.py`)"


def run_temperature(args: argparse.Namespace, temperature: float, replay: bool = True) -> list[dict[str, float]]:
    import lightning as L

    from lit_rlhf.data import QADataModule
    from lit_rlhf.modules import GRPOModule
    from lit_rlhf.online import RolloutCorrection, VLLMSampler
    from lit_rlhf.rewards import MathAnswerReward

    class Record(L.Callback):
        def __init__(self) -> None:
            self.rows: list[dict[str, float]] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            metrics = trainer.callback_metrics
            self.rows.append({name: float(metrics[f"train/rollout_correction/{name}"]) for name in STATS})

    L.seed_everything(args.seed)
    correction = RolloutCorrection("mask", "token", upper=2.0, lower=0.5)
    module = GRPOModule(model=args.model, reward_fns=[MathAnswerReward()], num_generations=4, scale="group", kl_coef=0.0,
                        max_new_tokens=args.max_new_tokens, temperature=temperature, top_k=args.top_k, top_p=args.top_p,
                        lr=2e-5, lr_scheduler="constant",
                        max_grad_norm=1.0, log_completions_every_n_steps=0,
                        rollout=VLLMSampler(engine_kwargs={"max_model_len": 1024}, correction=correction))
    if not replay:  # the learner's log-probs over the full vocabulary, as before the replay
        module.logprob_filter = (0, 1.0)
    data = QADataModule(path="bundled:arithmetic", tokenizer=module.tokenizer, batch_size=6)
    record = Record()
    trainer = L.Trainer(accelerator="cpu", devices=1, precision="32-true", max_steps=args.steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0, log_every_n_steps=1, callbacks=[record])
    trainer.fit(module, datamodule=data)
    module.rollout_source.engine = None  # the engine shuts down before the next temperature's is built
    del trainer, module, data
    gc.collect()
    return record.rows


def render(result: dict[str, Any]) -> str:
    """The per-temperature table: each statistic's median over the steps, with its range."""
    head = (f"Measured {result['date'][:16].replace('T', ' ')} on {result['machine']['cpu']} ({result['machine']['cores']} "
            f"cores; vLLM {result['machine']['vllm']}, torch {result['machine']['torch']}), {result['model']}, "
            f"{result['steps']} GRPO steps per temperature of 6 questions x 4 answers of up to {result['max_new_tokens']} "
            f"tokens{_sampling(result)}, the engine synced before every rollout; token mask [0.5, 2]. Median over the steps (min to max). "
            f"Raw file: `{result['file']}`.")
    lines = [head, "", "| temperature | " + " | ".join(STATS) + " |", "|---" * (len(STATS) + 1) + "|"]
    for temperature, rows in result["per_temperature"].items():
        cells = []
        for name in STATS:
            values = [r[name] for r in rows]
            spec = ".6f" if name.startswith("ratio") else ".3g"  # ratios sit near 1: their digits after it
            cells.append(f"{statistics.median(values):{spec}} ({min(values):{spec}} to {max(values):{spec}})")
        lines.append(f"| {temperature} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _sampling(result: dict[str, Any]) -> str:
    k, p = result.get("top_k", 0), result.get("top_p", 1.0)
    return f" sampled with top-k {k} and top-p {p} (the learner replays them unless the row says not)" if k or p < 1 else ""


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--replay-off-too", action="store_true", help="also a row per temperature without the replay")
    p.add_argument("--json", default=None)
    p.add_argument("--write", action="store_true", help="render into benchmarks/RESULTS.md (needs --json)")
    p.add_argument("--render", default=None, help="render this result file (and --write it) without measuring")
    args = p.parse_args(argv)
    if args.render:
        result = json.loads(Path(args.render).read_text())
        if args.write:
            write(result)
        print(render(result))
        return result
    import torch
    import vllm

    from benchmarks.common import machine_info
    from benchmarks.gpu.report import RESULTS_MD

    torch.set_num_threads(2)
    result: dict[str, Any] = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"), "model": args.model, "steps": args.steps,
        "max_new_tokens": args.max_new_tokens, "seed": args.seed, "load_average_before": os.getloadavg(),
        "machine": dict(machine_info(2), vllm=vllm.__version__, platform=platform.platform()),
        "top_k": args.top_k, "top_p": args.top_p, "per_temperature": {},
    }
    for t in args.temperatures:
        result["per_temperature"][str(t)] = run_temperature(args, t)
        if args.replay_off_too:
            result["per_temperature"][f"{t}, replay off"] = run_temperature(args, t, replay=False)
    result["load_average_after"] = os.getloadavg()
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            result["file"] = str(path.resolve().relative_to(RESULTS_MD.parents[1]))
        except ValueError:
            result["file"] = str(path)
        path.write_text(json.dumps(result, indent=2))
        if args.write:
            write(result)
    else:
        result["file"] = "-"
    print(render(result))
    return result


def write(result: dict[str, Any]) -> None:
    """Render `result` into RESULTS.md: the filtered-sampling table between its own markers."""
    if result.get("top_k", 0) or result.get("top_p", 1.0) < 1:
        write_block(render(result), FILTER_BEGIN, FILTER_END, TITLE + ", top-k / top-p replayed", after=f"## {TITLE}")
    else:
        write_block(render(result), BEGIN, END, TITLE, after="## Generation backends")


if __name__ == "__main__":
    main()
