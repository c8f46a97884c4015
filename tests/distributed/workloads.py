"""Tiny, fast fits of every method for the multi-process scripts (run by `launch.launch`).

Data are short hand-made strings through the real collators (no dataset loading: the CPU is
shared and every second counts); the models are `tiny-random-llama`. The strategies are the
ones of configs/strategy, on CPU with gloo: `ddp`, `fsdp2` (ModelParallelStrategy), and DeepSpeed `zero2` / `zero3` through the
test-only `CPUDeepSpeedStrategy` (with `stage3_param_persistence_threshold: 0`, so even the
tiny model's small tensors are really partitioned).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, DistributedSampler

from lit_rlhf.data.collate import PreferenceCollator, PromptCollator, SingleCollator
from lit_rlhf.data.packing import PackedSFTCollator
from lit_rlhf.rewards import CharacterFractionReward

PROMPTS = ["hello there", "what is", "tell me a story", "x y z", "abc", "The cat", "Q: 2+2?", "once upon"]
GOOD = [" yes indeed", " a fine answer", " sure thing", " ok", " well said", " it is so", " four", " a time"]
BAD = [" NO!!", " ???", " 12345", " ZZZ", " ...", " --", " 0", " #"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
METHODS = ("sft", "reward", "dpo", "kto", "drov", "ppo", "grpo")
OFFLINE = ("sft", "reward", "dpo", "kto", "drov")


# read once at start-up: Lightning rewrites some of these variables during a fit
_WORLD = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def world() -> tuple[int, int]:
    """(rank, world size) given by the launcher (tests/distributed/launch.py)."""
    return _WORLD


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def rows_for(method: str, tokenizer) -> tuple[list[dict[str, Any]], Any]:
    """(examples, collator) of a method; 8 examples."""
    eos = [tokenizer.eos_token_id]
    pad = tokenizer.pad_token_id
    if method in ("ppo", "grpo"):
        rows = [{"_prompt_ids": _ids(tokenizer, p), "prompt": p} for p in PROMPTS]
        return rows, PromptCollator(pad)
    if method == "sft":
        rows = [{"_prompt_ids": _ids(tokenizer, p), "_completion_ids": _ids(tokenizer, g) + eos, "prompt": p} for p, g in zip(PROMPTS, GOOD)]
        return rows, PackedSFTCollator(pad)  # packed rows (sdpa_varlen); padded SFT is the single-process tests'
    if method == "drov":
        rows = []
        for i, p in enumerate(PROMPTS):
            completion = GOOD[i] if i % 2 == 0 else BAD[i]
            rows.append({"_prompt_ids": _ids(tokenizer, p), "_completion_ids": _ids(tokenizer, completion) + eos, "_reward": float(i % 2 == 0), "prompt": p})
        return rows, SingleCollator(pad, reward_mean=0.5, reward_std=0.5)
    rows = [
        {"_prompt_ids": _ids(tokenizer, p), "_chosen_ids": _ids(tokenizer, g) + eos, "_rejected_ids": _ids(tokenizer, b) + eos,
         "prompt": p, "batch": f"b{i % 2}", "confidence": str(i % 3)}
        for i, (p, g, b) in enumerate(zip(PROMPTS, GOOD, BAD))
    ]
    return rows, PreferenceCollator(pad)


def loader(method: str, tokenizer, batch_size: int) -> DataLoader:
    rows, collate = rows_for(method, tokenizer)
    # no shuffling: rank r gets the rows r, r + W, ... (the Trainers use use_distributed_sampler=False)
    rank, size = world()
    sampler = DistributedSampler(rows, num_replicas=size, rank=rank, shuffle=False) if size > 1 else None
    return DataLoader(rows, batch_size=batch_size, shuffle=False, sampler=sampler, collate_fn=collate)


def build_module(method: str, **overrides: Any):
    """The method's LightningModule on the tiny model with small, fast settings."""
    from lit_rlhf.modules import (
        DAPOModule,
        DPOModule,
        DROVModule,
        GRPOModule,
        KTOModule,
        PPOModule,
        RewardModule,
        SFTModule,
    )

    common = dict(model="tiny-random-llama", lr=1e-3, lr_scheduler="constant")
    online = dict(reward_fns=[CharacterFractionReward(LETTERS)], max_new_tokens=6, log_completions_every_n_steps=0)
    table = {
        "sft": (SFTModule, {}),
        "reward": (RewardModule, {}),
        "dpo": (DPOModule, dict(beta=0.1)),
        "kto": (KTOModule, dict(beta=0.1)),
        "drov": (DROVModule, dict(value_lr=5e-3)),
        "ppo": (PPOModule, dict(online, ppo_epochs=1, num_minibatches=2, micro_batch_size=1, temperature=1.0)),
        "grpo": (GRPOModule, dict(online, num_generations=2, scale="batch", micro_batch_size=2, kl_coef=0.04)),
        # GRPO's settings plus DAPO's dynamic sampling (no clip-higher, no overlong filtering)
        "dapo": (DAPOModule, dict(online, num_generations=2, scale="batch", micro_batch_size=2, kl_coef=0.04,
                                  clip_eps_high=0.2, mask_truncated=False)),
    }
    cls, kwargs = table[method]
    return cls(**{**common, **kwargs, **overrides})


def make_strategy(name: str):
    if name == "ddp":
        from lightning.pytorch.strategies import DDPStrategy

        return DDPStrategy(process_group_backend="gloo", find_unused_parameters=False)
    if name in ("zero2", "zero3"):
        from tests.distributed.cpu_deepspeed import CPUDeepSpeedStrategy

        strategy = CPUDeepSpeedStrategy(stage=int(name[-1]), process_group_backend="gloo", exclude_frozen_parameters=True)
        strategy.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        return strategy
    if name in ("fsdp2", "fsdp2_file"):  # configs/strategy/fsdp2.yaml on CPU (lit_rlhf.training.sharding)
        from lightning.pytorch.strategies import ModelParallelStrategy

        # fsdp2_file: checkpoints as one consolidated file written by rank 0
        return ModelParallelStrategy(data_parallel_size=world()[1], tensor_parallel_size=1, process_group_backend="gloo",
                                     save_distributed_checkpoint=name == "fsdp2")
    if name == "single":
        return "auto"
    raise ValueError(f"unknown strategy {name!r}")


class RecordMetrics(Callback):
    """Every scalar in `trainer.callback_metrics` after each training batch, per rank."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
        step["prompts"] = list((getattr(batch, "meta", None) or {}).get("prompt", []))
        self.steps.append(step)


def trainer_for(strategy: str, root: Path, max_steps: int = 2, callbacks=(), **kwargs: Any) -> L.Trainer:
    _, size = world()
    return L.Trainer(
        accelerator="cpu", devices=size, num_nodes=1, strategy=make_strategy(strategy), precision="32-true",
        max_steps=max_steps, limit_val_batches=0, logger=False, enable_progress_bar=False,
        enable_model_summary=False, log_every_n_steps=1, use_distributed_sampler=False, default_root_dir=str(root), callbacks=list(callbacks),
        **{"enable_checkpointing": False, **kwargs},
    )


def trained_parameters(module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def fingerprint(module, zero3: bool = False) -> float:
    """Sum of every trainable parameter (float64); gathers the ZeRO-3 partitions and FSDP2 shards
    first (collectives)."""
    from torch.distributed.tensor import DTensor

    params = [p.full_tensor() if isinstance(p, DTensor) else p for p in trained_parameters(module)]
    if zero3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(params):
            return float(sum(p.detach().double().sum() for p in params))
    return float(sum(p.detach().double().sum() for p in params))


def write_result(out: Path, result: dict[str, Any]) -> None:
    rank, _ = world()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(result, indent=1, default=float))
    shutdown()


def shutdown() -> None:
    """Leave together, then end the process without interpreter finalisation.

    Every rank waits for the others and closes the process group; the result file is written
    already. The process then ends with `os._exit(0)`: gloo's worker threads may still be
    destroying finished work objects that own Python tensors (the barrier keeps the prior
    all-gathers alive), and a worker that needs the GIL while the interpreter finalises aborts
    the process ("terminate called without an active exception", exit -6; pytorch/pytorch
    #190489, caught in a core dump here: ProcessGroupGloo::runLoop -> ~AsyncBarrierWork ->
    decref_pyobject -> PyThread_exit_thread). That abort is torch's teardown, not a result.
    """
    import sys

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
