"""Shared prompts under DeepSpeed ZeRO-3 with 2 CPU ranks: a DPO step gives the padded rows'
gradients (output layer and embedding gathered from their shards) and the same weights."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.distributed.launch import launch

SCRIPT = Path(__file__).with_name("run_shared_prompt_distributed.py")


def test_dpo_under_zero3_gives_the_padded_gradients_and_weights(tmp_path):
    results = launch(SCRIPT, ["--strategy", "zero3"], 2, tmp_path, timeout=400)
    for rank in (0, 1):
        padded, shared = results[rank]["padded"], results[rank]["shared"]
        assert shared["strategy"] == "CPUDeepSpeedStrategy" and shared["partitioned"]
        a, b = torch.load(padded["grads"]), torch.load(shared["grads"])
        for name in ("lm_head", "embed"):
            assert a[f"{name}_local_numel"] < a[f"{name}_full_numel"]  # really partitioned
            assert bool(a[name].ne(0).any())
            torch.testing.assert_close(b[name], a[name], atol=1e-5, rtol=1e-4)
        assert abs(shared["after"] - padded["after"]) < 1e-4 * max(1.0, abs(padded["after"]))
