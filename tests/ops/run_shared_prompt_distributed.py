"""One DPO and one reward-model step under a distributed strategy (2 CPU ranks), with and without
shared prompts, from the same start: saves the full gradients of the output layer and the
embedding (ZeRO-3: gathered from the shards) and the weights' fingerprint after the step.

Run by `tests/ops/test_shared_prompt_distributed.py` through `tests.distributed.launch`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L  # noqa: E402
import torch  # noqa: E402

from tests.distributed import workloads as W  # noqa: E402
from tests.distributed.run_methods import GradProbe  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", required=True, choices=["ddp", "zero2", "zero3"])
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank, _ = W.world()
    results = {}
    for shared in (False, True):
        name = "shared" if shared else "padded"
        L.seed_everything(1 + rank)
        module = W.build_module("dpo", shared_prompt=shared)
        path = args.out / f"dpo_{name}_grads_rank{rank}.pt"
        trainer = W.trainer_for(args.strategy, args.out / "runs" / name, max_steps=1, callbacks=[GradProbe(path)])
        trainer.fit(module, W.loader("dpo", module.tokenizer, 2))
        results[name] = {"grads": str(path), "after": W.fingerprint(module, zero3=args.strategy == "zero3"),
                         "strategy": type(trainer.strategy).__name__,
                         "partitioned": all(hasattr(p, "ds_id") for p in module.policy.parameters())}
    W.write_result(args.out, results)


if __name__ == "__main__":
    main()
