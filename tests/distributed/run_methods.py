"""Fit several methods one after the other under one strategy, in every rank; write JSON results.

    python tests/distributed/run_methods.py --strategy ddp --methods sft,dpo,dpo:lora --out DIR   # per rank (launch.py)

Each entry of `--methods` is a job `method[:option]`, its results under that name: `dpo:lora`
builds the module with a small LoRA config (adapters on one frozen base), `grpo:whole` with
`frozen_placement: whole`. One launch runs every job of a strategy: the process start-up
(imports, process group, DeepSpeed) is most of a launch's cost on a CPU.

For each job: a fit of a few optimizer steps on the tiny model, then per rank the logged
metrics, a fingerprint of the trained parameters before and after (equal on every rank when the
gradients were reduced across ranks), and for online methods the response lengths each rank
generated. `--uneven_lengths` makes rank r sample 3 + 5 r tokens (ZeRO-3 regression: ranks that
stop generating at different steps need `synced_gpus=True`). `--checkpoint dpo,dpo:lora` also
saves a checkpoint of those jobs (a ZeRO directory under DeepSpeed), resumes from it for one
more step, and reports the resumed global step. `--grad_probe` saves the `dpo` job's full
(ZeRO-3: gathered) gradients of the output layer and the embedding at the first optimizer step,
then fits one more DPO step from the same start with the dense log-prob path
(`logprob_chunk_size: null`) and one with shared prompts (`shared_prompt: true`), saving their
gradients alike and the weights' fingerprint after that step.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L  # noqa: E402
import torch  # noqa: E402

from lit_rlhf.training.memory import Memory
from lit_rlhf.generation import needs_synced_gpus  # noqa: E402
from tests.distributed import workloads as W  # noqa: E402

BATCH = {"sft": 2, "reward": 2, "dpo": 2, "kto": 2, "drov": 2, "ppo": 4, "grpo": 2}


class LengthProbe(L.Callback):
    """Records the response lengths of each rollout and whether generation was synced."""

    def __init__(self) -> None:
        self.lengths: list[int] = []
        self.synced: list[bool] = []

    def on_rollout_scores(self, trainer, pl_module, rollout):
        self.lengths.append(int(rollout.response_attention_mask.sum(dim=1).max()))
        self.synced.append(needs_synced_gpus(trainer))  # what the sampler passes to generate
        return rollout


class GradProbe(L.Callback):
    """Saves the full gradients of the policy's output layer and embedding at the first optimizer
    step (before clipping and the step), and whether ZeRO-3 held them partitioned."""

    def __init__(self, path: Path) -> None:
        self.path, self.done = path, False

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self.done:
            return
        self.done = True
        from lit_rlhf.models.output_layer import _chunked  # the per-model decision of the log-prob path

        policy = pl_module.policy
        out = {"chunked_path": isinstance(_chunked.get(policy), tuple)}
        for name, param in (("lm_head", policy.lm_head.weight), ("embed", policy.model.embed_tokens.weight)):
            if hasattr(param, "ds_id"):  # ZeRO-3: gather the reduced gradient (collective)
                from deepspeed.utils import safe_get_full_grad

                grad = safe_get_full_grad(param)
                out[f"{name}_local_numel"], out[f"{name}_full_numel"] = param.numel(), param.ds_numel
            else:
                grad = param.grad
            out[name] = grad.detach().clone()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(out, self.path)


JOB_OPTIONS = {"lora": {"lora": {"r": 4, "alpha": 8}}, "whole": {"memory": Memory(frozen_placement="whole")}}


def parse_job(job: str) -> tuple[str, dict]:
    """`method[:option]` -> (method, the module overrides of the option)."""
    method, _, option = job.partition(":")
    if option and option not in JOB_OPTIONS:
        raise ValueError(f"unknown job option {option!r} in {job!r}: one of {sorted(JOB_OPTIONS)}")
    return method, dict(JOB_OPTIONS.get(option, {}))


def grad_probe_paths(root: Path, rank: int) -> dict[str, str]:
    return {kind: str(root / f"dpo_{kind}_grads_rank{rank}.pt") for kind in ("chunked", "dense", "shared")}


def fit_one(job: str, args, root: Path) -> dict:
    rank, size = W.world()
    method, options = parse_job(job)
    L.seed_everything(1 + rank)  # different sampling per rank, as in a real run
    batch = BATCH[method]
    online = method in ("ppo", "grpo")
    # online: one rollout (B prompts x G x world size episodes); its updates are the optimizer steps
    overrides = {"total_episodes": batch * (2 if method == "grpo" else 1) * size} if online else {}
    module = W.build_module(method, **overrides, **options)
    if args.uneven_lengths and method in ("ppo", "grpo"):
        module.sampling = dataclasses.replace(module.sampling, max_new_tokens=3 + 5 * rank)
    zero3 = args.strategy == "zero3"
    before = W.fingerprint(module)
    record, probe = W.RecordMetrics(), LengthProbe()
    probing = args.grad_probe and job == "dpo"
    extra = [GradProbe(Path(grad_probe_paths(root, rank)["chunked"]))] if probing else []
    run_dir = root / job.replace(":", "_")
    if online:
        trainer = W.trainer_for(args.strategy, run_dir, max_steps=-1, max_epochs=1, callbacks=[record, probe])
    else:
        trainer = W.trainer_for(args.strategy, run_dir, max_steps=2, callbacks=[record, *extra])
    started = time.perf_counter()
    trainer.fit(module, W.loader(method, module.tokenizer, batch))
    result = {
        "metrics": record.steps, "global_step": trainer.global_step, "before": before,
        "after": W.fingerprint(module, zero3=zero3), "seconds": time.perf_counter() - started,
        "lengths": probe.lengths, "synced": probe.synced, "strategy": type(trainer.strategy).__name__,
        "gradient_clipping": (getattr(trainer.strategy, "config", None) or {}).get("gradient_clipping"),
        # ZeRO-3 marks the parameters it partitions with `ds_id`
        "policy_partitioned": (None if getattr(module, "policy", None) is None
                               else all(hasattr(p, "ds_id") for p in module.policy.parameters())),
        "ref_partitioned": (None if getattr(module, "ref_model", None) is None
                            else all(hasattr(p, "ds_id") for p in module.ref_model.parameters())),
        "attention": getattr(getattr(getattr(module, "policy", None), "config", None), "_attn_implementation", None),
    }
    if job in args.checkpoint.split(","):
        result["resume"] = save_and_resume(job, args, root, trainer)
    if probing:
        result["grad_probe"] = grad_probe_paths(root, rank)
        for kind, overrides in (("dense", {"memory": Memory(logprob_chunk_size=None)}), ("shared", {"memory": Memory(shared_prompt=True)})):
            result[f"{kind}_after"] = one_probed_step(method, kind, overrides, args, root)
    return result


def one_probed_step(method: str, kind: str, overrides: dict, args, root: Path) -> float:
    """One step of `method` from the same start with `overrides`, its gradients saved (GradProbe);
    returns the weights' fingerprint after the step."""
    rank, _ = W.world()
    L.seed_everything(1 + rank)
    module = W.build_module(method, **overrides)
    probe = GradProbe(Path(grad_probe_paths(root, rank)[kind]))
    trainer = W.trainer_for(args.strategy, root / f"{method}_{kind}", max_steps=1, callbacks=[probe])
    trainer.fit(module, W.loader(method, module.tokenizer, BATCH[method]))
    return W.fingerprint(module, zero3=args.strategy == "zero3")


def save_and_resume(job: str, args, root: Path, trainer) -> dict:
    """Save a checkpoint (a directory under DeepSpeed), resume from it in a new Trainer for one step."""
    rank, _ = W.world()
    method, options = parse_job(job)
    name = job.replace(":", "_")
    ckpt = root / f"{name}.ckpt"
    trainer.save_checkpoint(ckpt)
    L.seed_everything(1 + rank)
    module = W.build_module(method, **options)
    record = W.RecordMetrics()
    resumed = W.trainer_for(args.strategy, root / f"{name}_resumed", max_steps=trainer.global_step + 1, callbacks=[record])
    resumed.fit(module, W.loader(method, module.tokenizer, BATCH[method]), ckpt_path=str(ckpt))
    resumed_after = W.fingerprint(module, zero3=args.strategy == "zero3")
    # the same number of steps without interruption: resuming must land on the same weights
    L.seed_everything(1 + rank)
    module = W.build_module(method, **options)
    straight = W.trainer_for(args.strategy, root / f"{name}_straight", max_steps=trainer.global_step + 1)
    straight.fit(module, W.loader(method, module.tokenizer, BATCH[method]))
    return {
        "ckpt": str(ckpt), "is_dir": ckpt.is_dir(), "global_step": resumed.global_step, "metrics": record.steps,
        "after": resumed_after, "straight_after": W.fingerprint(module, zero3=args.strategy == "zero3"),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", required=True, choices=["ddp", "zero2", "zero3"])
    parser.add_argument("--methods", required=True, help="comma-separated jobs: method[:lora|:whole]")
    parser.add_argument("--uneven_lengths", action="store_true")
    parser.add_argument("--checkpoint", default="", help="comma-separated jobs to checkpoint and resume")
    parser.add_argument("--grad_probe", action="store_true")
    # manual check of the regression: generation WITHOUT synced_gpus (crashes on gloo, hangs on NCCL)
    parser.add_argument("--force_unsynced", action="store_true")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.force_unsynced:
        from lit_rlhf.modules.online import OnlineModule

        OnlineModule._synced_gpus = property(lambda self: False)
    jobs = args.methods.split(",")
    for job in jobs:
        parse_job(job)  # a typo fails before any fit
    results = {}
    for job in jobs:
        results[job] = fit_one(job, args, args.out / "runs")
    W.write_result(args.out, results)


if __name__ == "__main__":
    main()
