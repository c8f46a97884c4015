"""Same global batch, 1 process x micro-batch 2b or 2 processes (DDP) x micro-batch b.

    python tests/distributed/run_equivalence.py --methods dpo,grpo --global_batch 4 --out DIR   # per rank

Every rank writes its logged losses per step; rank 0 also writes the updated policy weights
(`<method>_policy.pt`). With no shuffling, one process sees rows [0..2b) at step 0 and DDP rank r
the rows r, r+2, ... of it, so both runs see the same global batches.

GRPO's sampling is made independent of how rows are split: each row is generated alone with a
seed derived from its prompt tokens and its copy index in the group (the real
`generate_responses`, one row at a time), so both runs sample the same completions and any
difference comes from the update (advantages with `scale: batch`, loss aggregation, gradient
reduction). GRPO uses `aggregation: sequence_mean`, whose global mean is the mean of the ranks'
means (see the test for `token_mean`).
"""

from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L  # noqa: E402
import torch  # noqa: E402

from lit_rlhf.online import sources as online_rollout  # noqa: E402
from tests.distributed import workloads as W  # noqa: E402

GROUP = 2
LOSS_KEY = {"dpo": "train/loss", "grpo": "train/loss/total"}


def row_seeded_generation(real):
    def generate(model, prompt_ids, prompt_mask, config, eos_token_id, pad_token_id, synced_gpus=False):
        parts = []
        for i in range(prompt_ids.shape[0]):
            ids = prompt_ids[i][prompt_mask[i]].unsqueeze(0)  # (1, P_i) without padding
            seed = zlib.crc32(str(ids.tolist()).encode()) + 7919 * (i % GROUP)  # copy index within the group
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                parts.append(real(model, ids, torch.ones_like(ids, dtype=torch.bool), config, eos_token_id, pad_token_id, synced_gpus))
        return tuple(torch.cat(column) for column in zip(*parts))

    return generate


def run(method: str, args, strategy: str) -> dict:
    rank, size = W.world()
    if args.global_batch % size:
        raise ValueError(f"global batch {args.global_batch} does not split over {size} processes")
    micro = args.global_batch // size
    L.seed_everything(0)
    if method == "dpo":
        module = W.build_module("dpo")
        trainer_kwargs = dict(max_steps=2)
    else:
        module = W.build_module(
            "grpo", num_generations=GROUP, scale="batch", aggregation="sequence_mean", micro_batch_size=None,
            total_episodes=2 * args.global_batch * GROUP,  # two rollouts
        )
        trainer_kwargs = dict(max_steps=-1, max_epochs=1)
    record = W.RecordMetrics()
    trainer = W.trainer_for(strategy, args.out / "runs" / method, callbacks=[record], **trainer_kwargs)
    trainer.fit(module, W.loader(method, module.tokenizer, micro))
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in module.policy.state_dict().items()}, args.out / f"{method}_policy.pt")
    keys = (LOSS_KEY[method], "train/objective/scores", "train/rewards/margins", "prompts")
    return {
        "global_step": trainer.global_step,
        "steps": [{k: step[k] for k in keys if k in step} for step in record.steps],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--methods", required=True)
    parser.add_argument("--global_batch", type=int, default=4)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    online_rollout.generate_responses = row_seeded_generation(online_rollout.generate_responses)
    _, size = W.world()
    strategy = "ddp" if size > 1 else "single"
    W.write_result(args.out, {method: run(method, args, strategy) for method in args.methods.split(",")})


if __name__ == "__main__":
    main()
