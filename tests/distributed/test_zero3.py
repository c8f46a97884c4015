"""DeepSpeed ZeRO-3 with 2 CPU processes: DPO, PPO, GRPO with ranks generating responses of
different lengths, then save / resume / export of a ZeRO-3 checkpoint.

Regression: under ZeRO-3 every forward pass all-gathers the partitioned weights, so a rank that
stops generating early leaves the other blocked in a collective (gloo: a crash, NCCL: a hang).
Here rank r samples 3 + 5 r tokens, and generation must run with `synced_gpus=True`
(`lit_rlhf.generation.needs_synced_gpus`). The launcher kills every rank after its timeout, so
a hang fails the test instead of blocking CI. (`run_methods.py --force_unsynced` shows the
crash without the fix.)

Checkpoint: DPO's ZeRO-3 directory is resumed for one more step (same weights as 3 steps in a
row), then `lit_rlhf.export` (the `python -m lit_rlhf.export <dir> <out>` entry) consolidates the shards and plain
transformers loads the result with the trained weights.

Log-probs: the chunked path (the default) gives DPO the same gradients as the dense logits with
the output layer's weight partitioned (gathered by ZeRO-3's hooks around the output layer), and
so do shared prompts (each prompt once, its responses attending to it).

All of it, and the LoRA jobs of test_lora.py, is one launch: the `zero3_run` fixture of conftest.py.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from lit_rlhf.export import main as export_main

from tests.distributed.checks import check_method_results
from tests.distributed.conftest import DEEPSPEED_METHODS as METHODS


def test_dpo_ppo_grpo_train_under_zero3_with_uneven_generation_lengths(zero3_run):
    results = zero3_run
    check_method_results(results, METHODS, "CPUDeepSpeedStrategy")
    for method in ("ppo", "grpo"):
        rank0, rank1 = results[0][method], results[1][method]
        assert rank0["synced"] == [True] and rank1["synced"] == [True]
        # the two ranks really stopped at different steps: <= 3 tokens on rank 0, 4..8 on rank 1
        assert rank0["lengths"][0] <= 3 < rank1["lengths"][0] <= 8, (rank0["lengths"], rank1["lengths"])


def test_chunked_logprobs_give_the_dense_gradients_with_the_output_layer_partitioned(zero3_run):
    results = zero3_run
    for rank in (0, 1):
        paths = results[rank]["dpo"]["grad_probe"]
        chunked, dense = torch.load(paths["chunked"]), torch.load(paths["dense"])
        assert chunked["chunked_path"] and not dense["chunked_path"]
        for name in ("lm_head", "embed"):
            assert chunked[f"{name}_local_numel"] < chunked[f"{name}_full_numel"]  # partitioned (released after use)
            assert chunked[name].numel() == chunked[f"{name}_full_numel"] and chunked[name].abs().max() > 0
            torch.testing.assert_close(chunked[name].view(-1), dense[name].view(-1), atol=1e-5, rtol=1e-5, msg=name)


def test_shared_prompts_give_the_padded_gradients_and_weights(zero3_run):
    # one DPO step from the same start, padded rows (the chunked probe) and shared prompts; the
    # weights after it against the dense padded step's
    for rank in (0, 1):
        dpo = zero3_run[rank]["dpo"]
        padded, shared = torch.load(dpo["grad_probe"]["chunked"]), torch.load(dpo["grad_probe"]["shared"])
        for name in ("lm_head", "embed"):
            for grads in (padded, shared):
                assert grads[f"{name}_local_numel"] < grads[f"{name}_full_numel"]  # really partitioned
            assert bool(padded[name].ne(0).any())
            torch.testing.assert_close(shared[name], padded[name], atol=1e-5, rtol=1e-4, msg=name)
        assert dpo["shared_after"] != pytest.approx(dpo["before"], rel=1e-7, abs=0)  # the step moved the weights
        assert abs(dpo["shared_after"] - dpo["dense_after"]) < 1e-4 * max(1.0, abs(dpo["dense_after"]))


def test_zero3_checkpoint_resumes_and_exports_to_hugging_face(zero3_run, tmp_path):
    results = zero3_run
    dpo = results[0]["dpo"]
    resume = dpo["resume"]
    assert resume["is_dir"], "a ZeRO-3 checkpoint is a directory of shards"
    assert resume["global_step"] == dpo["global_step"] + 1
    # resuming from step 2 and taking step 3 = 3 uninterrupted steps (weights and Adam state restored)
    assert resume["after"] == pytest.approx(resume["straight_after"], rel=1e-9)
    assert resume["after"] != pytest.approx(dpo["after"], rel=1e-7, abs=0)

    out = tmp_path / "hf"
    export_main([resume["ckpt"], str(out)])  # = python -m lit_rlhf.export <dir> <out>, in this process
    model = AutoModelForCausalLM.from_pretrained(out)  # plain transformers
    total = float(sum(p.detach().double().sum() for p in model.parameters()))
    # the exported weights are the ones trained for 2 steps under ZeRO-3 (not the initial ones)
    assert total == pytest.approx(dpo["after"], rel=1e-9)
    assert total != pytest.approx(dpo["before"], rel=1e-7, abs=0)
    ids = torch.tensor([[1, 2, 3]])
    assert torch.isfinite(model(ids).logits).all()


def test_frozen_models_are_partitioned_by_default_and_whole_on_request(zero3_run):
    for rank in (0, 1):
        assert zero3_run[rank]["grpo"]["policy_partitioned"] and zero3_run[rank]["grpo"]["ref_partitioned"]
    # `frozen_placement: whole`: the reference stays a full copy on every rank, the policy is sharded
    check_method_results(zero3_run, ("grpo:whole",), "CPUDeepSpeedStrategy")
    for rank in (0, 1):
        whole = zero3_run[rank]["grpo:whole"]
        assert whole["policy_partitioned"] is True
        assert whole["ref_partitioned"] is False
        assert whole["synced"] == [True]
