"""FSDP2 (Lightning's `ModelParallelStrategy`, `lit_rlhf.training.sharding`) in every rank: fits,
exact resume, export and the vLLM weight gather; writes JSON results (`launch.py` starts it).

    python tests/distributed/run_fsdp2.py --jobs dpo,grpo,ppo,sft,dpo:lora,dpo:file --resume dpo,grpo,dpo:file --out DIR

Per job: a fit of a few optimizer steps on the tiny model (`workloads`), then per rank the logged
metrics, the fingerprint of the trained weights (gathered: equal on every rank when the gradients
were reduced), whether every trained parameter is a `DTensor` shard and the shard sizes. The
`dpo` job also exports at fit end (`export_dir`), saves its checkpoint (a directory of shards)
and, on rank 0, the policy's consolidated state (`sharding.full_state_dict`) next to what
`gathered_parameters` (the vLLM sync's gather) returned: the test compares them with the export.
PPO's ranks sample responses of different lengths (3 + 5 r tokens: every forward all-gathers, so
generation must be synced). `dpo:lora` saves the LoRA merge (`merged_weights`) beside its export; `grpo:whole` keeps its reference whole on every rank
(`frozen_placement: whole`). `<method>:ddp` is the same fit under DDP. `dpo:dense` takes the dense
log-prob path (the reference the chunked path of `dpo` is compared with); `dpo:file` checkpoints as one
consolidated file (`save_distributed_checkpoint: false`). Offline fits clip their gradients at a
norm below the tiny model's (`ClipProbe` records the norms around Lightning's clipping). `--resume` jobs: the fit
stopped after 2 steps is resumed from its checkpoint for a 3rd, and compared tensor by tensor
with 3 uninterrupted steps (`resume_equal`, the first differing names otherwise).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

from lit_rlhf.training import sharding  # noqa: E402
from lit_rlhf.training.memory import Memory  # noqa: E402
from tests.distributed import workloads as W  # noqa: E402
from tests.distributed.run_methods import BATCH, LengthProbe, parse_job  # noqa: E402

ONLINE = ("ppo", "grpo")
CLIP = 0.05


def split_job(job: str) -> tuple[str, dict, str]:
    """`method[:lora|:file]` -> (method, module overrides, strategy): `file` checkpoints as one
    consolidated file (`save_distributed_checkpoint: false`)."""
    if job.endswith(":file"):
        return job.partition(":")[0], {}, "fsdp2_file"
    if job.endswith(":ddp"):  # the same fit under DDP: what FSDP2 must compute too
        return job.partition(":")[0], {}, "ddp"
    if job.endswith(":dense"):  # the dense log-prob path, the reference of the chunked one
        return job.partition(":")[0], {"memory": Memory(logprob_chunk_size=None)}, "fsdp2"
    return (*parse_job(job), "fsdp2")


class ClipProbe(L.Callback):
    """The total gradient norm before and after Lightning's clipping (`trainer.gradient_clip_val`),
    at every optimizer step: the norms of `DTensor` gradients, reduced over the shards."""

    def __init__(self) -> None:
        self.before: list[float] = []
        self.after: list[float] = []

    def on_fit_start(self, trainer, pl_module) -> None:
        own = pl_module.clip_gradients

        def norm() -> float:
            total = torch.nn.utils.get_total_norm([p.grad for p in pl_module.parameters() if p.grad is not None])
            return float(total.full_tensor() if isinstance(total, DTensor) else total)

        def clip(optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
            self.before.append(norm())
            own(optimizer, gradient_clip_val, gradient_clip_algorithm)
            self.after.append(norm())

        pl_module.clip_gradients = clip


def build(job: str, rollouts: int, **extra):
    rank, size = W.world()
    method, options, _ = split_job(job)
    L.seed_everything(1 + rank)
    batch = BATCH[method]
    overrides = {"total_episodes": batch * (2 if method == "grpo" else 1) * size * rollouts} if method in ONLINE else {}
    module = W.build_module(method, **overrides, **options, **extra)
    if method == "ppo":  # rank r samples 3 + 5 r tokens: the ranks stop generating at different steps
        module.sampling = dataclasses.replace(module.sampling, max_new_tokens=3 + 5 * rank)
    return method, module


def loader(method: str, tokenizer) -> DataLoader:
    """`workloads.loader`'s rows for this rank, with the loader's own generator: a new epoch's
    iterator then draws nothing from the global generator, which a resumed run restores at another
    point of the epoch loop than an uninterrupted run reaches it (as `lit_rlhf.data` loaders do)."""
    rank, size = W.world()
    rows, collate = W.rows_for(method, tokenizer)
    sampler = DistributedSampler(rows, num_replicas=size, rank=rank, shuffle=False)
    return DataLoader(rows, batch_size=BATCH[method], sampler=sampler, collate_fn=collate,
                      generator=torch.Generator().manual_seed(0))


def fit(job: str, root: Path, steps: int, rollouts: int = 1, ckpt_path: str | None = None, **extra):
    method, module = build(job, rollouts, **extra)
    strategy = split_job(job)[2]
    record = W.RecordMetrics()
    record.before = W.fingerprint(module)  # not sharded yet
    online = method in ONLINE
    # online: one epoch of prompts for a whole fit (steps -1), else as many epochs as the steps take
    epochs = ({"max_epochs": 1 if steps == -1 else -1} if online else {})
    record.lengths, record.clip = LengthProbe(), ClipProbe()
    # offline: Lightning's clipping at a norm the tiny model's gradients exceed (online: max_grad_norm 1.0)
    clip = {} if online else {"gradient_clip_val": CLIP}
    trainer = W.trainer_for(strategy, root, max_steps=steps, callbacks=[record, record.lengths, record.clip],
                            **epochs, **clip)
    trainer.fit(module, loader(method, module.tokenizer), ckpt_path=ckpt_path)
    return module, trainer, record


def trained_state(module) -> dict[str, torch.Tensor]:
    """The consolidated trained weights (rank 0; empty elsewhere): a collective."""
    full = sharding.full_state_dict(module)
    names = {n for n, p in module.named_parameters() if p.requires_grad}
    return {k: v for k, v in full.items() if k in names}


def describe(module, trainer, record) -> dict:
    params = W.trained_parameters(module)
    return {
        "metrics": record.steps, "global_step": trainer.global_step, "strategy": type(trainer.strategy).__name__,
        "before": record.before, "after": W.fingerprint(module),
        "lengths": record.lengths.lengths, "synced": record.lengths.synced,
        "clip": {"before": record.clip.before, "after": record.clip.after, "value": CLIP}, "all_dtensor": all(isinstance(p, DTensor) for p in params),
        "sharded": [n for n, p in module.named_parameters() if isinstance(p, DTensor) and p.to_local().numel() < p.numel()][:3],
        "frozen_dtensor": [name for name in getattr(module, "_frozen_names", ())
                           if all(isinstance(p, DTensor) for p in getattr(module, name).parameters())],
        "frozen_plain": [name for name in getattr(module, "_frozen_names", ())
                         if not any(isinstance(p, DTensor) for p in getattr(module, name).parameters())],
    }


def run_job(job: str, args, root: Path) -> dict:
    rank, _ = W.world()
    method = split_job(job)[0]
    name = job.replace(":", "_")
    export = {} if method in ONLINE else {"export_dir": str(root / f"{name}_export")}
    steps = 2 if method not in ONLINE else -1
    module, trainer, record = fit(job, root / name, steps, **export)
    result = describe(module, trainer, record)
    if export:
        result["export_dir"] = export["export_dir"]
    if job == "dpo:dense":
        full = sharding.full_state_dict(module.policy)  # collective
        if rank == 0:
            torch.save({"full": full}, root / "dpo_dense_policy.pt")
        return {**result, "policy_pt": str(root / "dpo_dense_policy.pt")}
    if job == "dpo:file":
        return {**result, "resume": resume(job, root, trainer, module)}  # a checkpoint file, resumed
    if job in ("dpo", "dpo:lora"):
        ckpt = root / f"{name}.ckpt"
        trainer.save_checkpoint(ckpt)
        result["ckpt"], result["ckpt_is_dir"] = str(ckpt), ckpt.is_dir()
        full = sharding.full_state_dict(module.policy)  # collective
        if job == "dpo":
            from lit_rlhf.generation.vllm_weights import gathered_parameters

            gathered = {n: t.clone() for n, t in gathered_parameters(module.policy)}  # collective
            result["gathered_is_plain"] = not any(isinstance(t, DTensor) for t in gathered.values())
            if rank == 0:
                torch.save({"full": full, "gathered": gathered}, root / "dpo_policy.pt")
        else:
            from lit_rlhf.models import adapters
            from lit_rlhf.models.merging import merged_weights

            merged = {n: t.clone() for n, t in merged_weights(module.policy, adapters.POLICY)}  # collective
            result["merged_is_plain"] = not any(isinstance(t, DTensor) for t in merged.values())
            if rank == 0:
                torch.save({"merged": merged}, root / "dpo_lora_merged.pt")
        result["policy_pt"] = str(root / ("dpo_policy.pt" if job == "dpo" else "dpo_lora_merged.pt"))
    if job in args.resume:
        result["resume"] = resume(job, root, trainer, module)
    return result


def resume(job: str, root: Path, first_trainer, first_module) -> dict:
    """The fit of `run_job` stopped after 2 optimizer steps (its checkpoint), resumed for a 3rd;
    against 3 uninterrupted steps: every trained tensor bitwise."""
    method = split_job(job)[0]
    name = job.replace(":", "_")
    online = method in ONLINE
    ckpt = root / f"{name}_stopped.ckpt"
    stopped_at = first_trainer.global_step
    if online:  # the online fit ran to its episodes' end; stop a fresh one after 2 steps
        module, trainer, _ = fit(job, root / f"{name}_stopped", 2, rollouts=3)
        stopped_at = trainer.global_step
        trainer.save_checkpoint(ckpt)
    else:
        first_trainer.save_checkpoint(ckpt)
    resumed, trainer, record = fit(job, root / f"{name}_resumed", stopped_at + 1, rollouts=3, ckpt_path=str(ckpt))
    resumed_state, resumed_step = trained_state(resumed), trainer.global_step
    straight, trainer, straight_record = fit(job, root / f"{name}_straight", stopped_at + 1, rollouts=3)
    straight_state = trained_state(straight)
    differ = [k for k in straight_state if not torch.equal(straight_state[k], resumed_state.get(k, torch.empty(0)))]
    return {
        "ckpt": str(ckpt), "ckpt_is_dir": ckpt.is_dir(), "ckpt_is_file": ckpt.is_file(), "stopped_at": stopped_at, "global_step": resumed_step,
        "straight_step": trainer.global_step, "compared": len(straight_state), "differ": differ[:5],
        "resume_equal": not differ, "moved": W.fingerprint(resumed) != W.fingerprint(first_module),
        "resumed_metrics": record.steps, "straight_metrics": straight_record.steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", required=True, help="comma-separated jobs: method[:lora]")
    parser.add_argument("--resume", default="", help="comma-separated jobs to stop, resume and compare")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    args.resume = [j for j in args.resume.split(",") if j]
    torch.set_num_threads(1)
    results = {job: run_job(job, args, args.out / "runs") for job in args.jobs.split(",")}
    W.write_result(args.out, results)


if __name__ == "__main__":
    main()
