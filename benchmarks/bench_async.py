"""Synchronous vs asynchronous rollouts: trainer idle fraction and samples per second of GRPO fits.

    python -m benchmarks.bench_async --model smollm2-135m-instruct --rollouts 6 --json benchmarks/results/async.json

Each mode is a real `GRPOModule` fit (Lightning's loop, the same prompts, reward, seed and
settings), `--rollouts` rollouts of `--prompts` prompts x G = `--generations` samples of at most
`--new-tokens` tokens (temperature 1), one optimizer step each:

- `sync`: rollouts sampled inside the training step (the default `HFSampler`), the reference;
- `async_hf`: `AsyncRollouts(max_staleness=1)`, a producer thread samples batch k + 1 on its own copy of the
  policy while the learner updates on batch k (both in this process, sharing its cores);
- `server`: `AsyncRollouts(max_staleness=1, server=VLLMServerBackend())`: a vLLM engine in its own
  process started by the trainer (its start is not timed), weights pushed as a file per version.

Per mode, over the rollouts after the first (the warm-up): the median step (from one step's end
to the next), samples per second (sampled responses / wall time), the trainer's idle fraction
(the share of each step spent waiting for its batch; 1 - the update's share for `sync`, which
samples inside the step), and the median sampling, waiting and update times. The modes run one
after the other in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

MODES = ("sync", "async_hf", "server")


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    import lightning as L
    from lightning.pytorch.callbacks import Callback

    from lit_rlhf.data import TLDRPromptDataModule
    from lit_rlhf.modules import GRPOModule
    from lit_rlhf.online import AsyncRollouts, VLLMServerBackend
    from lit_rlhf.rewards import CharacterFractionReward

    class Steps(Callback):
        def __init__(self) -> None:
            self.ends: list[float] = []
            self.metrics: list[dict[str, float]] = []

        def on_train_batch_end(self, trainer, pl_module, *rest) -> None:
            self.ends.append(time.perf_counter())
            self.metrics.append({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")})

    L.seed_everything(args.seed)
    extra: dict[str, Any] = {}
    if mode != "sync":
        server = VLLMServerBackend(engine_kwargs={"max_model_len": 1024}) if mode == "server" else None
        extra["rollout"] = AsyncRollouts(max_staleness=1, timeout=1800, server=server)
    module = GRPOModule(model=args.model, reward_fns=[CharacterFractionReward("abcdefghijklmnopqrstuvwxyz")],
                        num_generations=args.generations, max_new_tokens=args.new_tokens, temperature=1.0,
                        kl_coef=0.0, lr=1e-6, log_completions_every_n_steps=0, **extra)
    dm = TLDRPromptDataModule(tokenizer=args.model, path="bundled:tldr_sft", max_prompt_length=args.prompt_tokens,
                              batch_size=args.prompts, limit=args.prompts * (args.rollouts + 1), val_split=None,
                              test_split=None, seed=args.seed)
    steps = Steps()
    root = tempfile.mkdtemp(prefix=f"bench_async_{mode}_")
    trainer = L.Trainer(max_steps=args.rollouts, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[steps],
                        default_root_dir=root, log_every_n_steps=1)
    trainer.fit(module, datamodule=dm)
    ends, metrics = steps.ends, steps.metrics
    durations = [b - a for a, b in zip(ends, ends[1:])]  # every step after the first
    rows = args.prompts * args.generations
    timed = metrics[1:]

    def median(key: str) -> float | None:
        values = [m[key] for m in timed if key in m]
        return statistics.median(values) if values else None

    if mode == "sync":
        idle = [m["train/time/generation"] / (m["train/time/generation"] + m["train/time/update"]) for m in timed]
    else:
        idle = [m["train/perf/trainer_idle_fraction"] for m in timed]
    return {
        "mode": mode,
        "median_step_s": statistics.median(durations),
        "samples_per_s": rows * len(durations) / (ends[-1] - ends[0]),
        "trainer_idle_fraction": statistics.mean(idle),
        "median_sampling_s": median("train/time/rollout_sampling") if mode != "sync" else median("train/time/generation"),
        "median_wait_s": median("train/time/rollout_wait"),
        "median_update_s": median("train/time/update"),
        "median_weight_sync_check_s": median("train/time/weight_sync_check"),  # the sync check, per step
        "staleness_max": max((m.get("train/async/staleness_max", 0.0) for m in metrics), default=0.0),
        "max_sampler_logprob_gap": max((m.get("train/rollout/sampler_logprob_diff_max", 0.0) for m in metrics), default=0.0),
        "step_durations_s": durations,
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rollouts", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=160, help="max prompt length (TL;DR posts, D2)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from lit_rlhf.apps.compare_policies import machine

    started, load_before = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), os.getloadavg()
    results = []
    for mode in args.modes:
        result = run_mode(mode, args)
        results.append(result)
        print(json.dumps({k: v for k, v in result.items() if k != "step_durations_s"}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "created": started, "machine": machine(),
                                               "load_before": load_before, "results": results}, indent=1))
    return results


if __name__ == "__main__":
    main()
