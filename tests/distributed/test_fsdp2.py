"""FSDP2 through Lightning's `ModelParallelStrategy` with 2 CPU processes (gloo): every model of a
module sharded in `configure_model` (`lit_rlhf.training.sharding`), `configs/strategy/fsdp2.yaml`.

- SFT (packed rows), the reward model, DPO, KTO, DRO-V, PPO, GRPO, and DPO and the reward model
  with LoRA train: every trained parameter is a `DTensor` shard, the frozen reference too, and the
  ranks end with the same weights (gradients reduced);
  PPO's ranks generate responses of different lengths (synced generation, as under ZeRO-3).
  The log-probs take the chunked path (the default), which reads the output layer outside the
  model's forward: it runs as the root's forward (`lit_rlhf.models.output_layer.as_root_forward`);
- DPO and GRPO stopped after 2 optimizer steps resume from their checkpoint (a directory of
  shards; for DPO also one consolidated file, `save_distributed_checkpoint: false`) to the same
  weights, bit for bit, as 3 uninterrupted steps;
- each method's fit ends with the weights the same fit under DDP ends with (to float rounding);
- Lightning's gradient clipping (`trainer.gradient_clip_val`) clips the sharded gradients to the
  norm asked for (PPO and GRPO clip with `max_grad_norm`);
- the export at fit end (`export_dir`) and `python -m lit_rlhf.export <sharded dir> <out>` load
  with `from_pretrained` and hold the consolidated weights; the vLLM sync's gather
  (`gathered_parameters`) and the LoRA merge (`merged_weights`) hand out whole tensors.

All of it is one launch: the `fsdp2_run` fixture of conftest.py (run_fsdp2.py).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from lit_rlhf.export import main as export_main
from tests.distributed.checks import check_method_results

METHODS = ("sft", "reward", "dpo", "kto", "drov", "ppo", "grpo")


def _hf_names(state: dict[str, torch.Tensor], prefix: str = "policy.") -> dict[str, torch.Tensor]:
    return {k.removeprefix(prefix): v for k, v in state.items()}


def _assert_same(model, expected: dict[str, torch.Tensor]) -> None:
    own = model.state_dict()
    assert expected and set(expected) <= set(own), sorted(set(expected) - set(own))[:5]
    for name, tensor in expected.items():
        assert torch.equal(own[name], tensor), name


def test_every_method_trains_with_every_model_sharded(fsdp2_run):
    check_method_results(fsdp2_run, METHODS, "ModelParallelStrategy")
    for rank in (0, 1):
        for method in METHODS:
            res = fsdp2_run[rank][method]
            assert res["all_dtensor"], (rank, method)
            assert res["sharded"], (rank, method)  # each rank holds a part of the weights
        for method in ("dpo", "kto", "drov", "grpo"):  # the frozen reference is sharded too (forward only)
            assert fsdp2_run[rank][method]["frozen_dtensor"] == ["ref_model"], (rank, method)
        for method in ("ppo", "grpo"):  # every forward all-gathers: the ranks generate in step
            assert fsdp2_run[rank][method]["synced"] == [True], (rank, method)
    # PPO's ranks stopped generating at different steps: <= 3 tokens on rank 0, 4..8 on rank 1
    rank0, rank1 = fsdp2_run[0]["ppo"]["lengths"], fsdp2_run[1]["ppo"]["lengths"]
    assert rank0[0] <= 3 < rank1[0] <= 8, (rank0, rank1)


@pytest.mark.parametrize("method", ["sft", "reward", "dpo", "drov", "ppo", "grpo"])
def test_fsdp2_trains_to_the_weights_ddp_trains_to(fsdp2_run, method):
    """The same fit (same rows per rank, same seeds; PPO and GRPO sample the same responses)
    under DDP: the weights after it agree to float rounding (reductions in another order)."""
    for rank in (0, 1):
        sharded, replicated = fsdp2_run[rank][method], fsdp2_run[rank][f"{method}:ddp"]
        assert replicated["strategy"] == "DDPStrategy" and sharded["before"] == replicated["before"]
        assert sharded["lengths"] == replicated["lengths"], (rank, method)
        assert sharded["after"] != pytest.approx(sharded["before"], rel=1e-7, abs=0), (rank, method)
        assert sharded["after"] == pytest.approx(replicated["after"], rel=1e-7), (rank, method)


def test_frozen_placement_whole_keeps_the_reference_replicated(fsdp2_run):
    check_method_results(fsdp2_run, ("grpo:whole",), "ModelParallelStrategy")
    for rank in (0, 1):
        res = fsdp2_run[rank]["grpo:whole"]
        assert res["all_dtensor"] and res["frozen_plain"] == ["ref_model"] and res["frozen_dtensor"] == [], rank


def test_chunked_logprobs_train_as_the_dense_logits_do(fsdp2_run):
    """The chunked path reads the embedding and the output layer outside the model's forward,
    as the sharded root's forward: its 2 DPO steps land where the dense path's do (gradients of
    the root's weights reduced like every other)."""
    chunked = torch.load(fsdp2_run[0]["dpo"]["policy_pt"])["full"]
    dense = torch.load(fsdp2_run[0]["dpo:dense"]["policy_pt"])["full"]
    assert set(chunked) == set(dense)
    for name in chunked:
        torch.testing.assert_close(chunked[name], dense[name], rtol=1e-4, atol=1e-5, msg=name)


def test_lora_policy_trains_sharded_and_merges_whole(fsdp2_run):
    check_method_results(fsdp2_run, ("dpo:lora", "reward:lora"), "ModelParallelStrategy")
    for rank in (0, 1):
        res = fsdp2_run[rank]["dpo:lora"]
        assert res["all_dtensor"] and res["merged_is_plain"], rank
        assert fsdp2_run[rank]["reward:lora"]["all_dtensor"], rank  # a reward adapter and its head
    res = fsdp2_run[0]["dpo:lora"]
    merged = torch.load(res["policy_pt"])["merged"]
    exported = AutoModelForCausalLM.from_pretrained(res["export_dir"])
    own = exported.state_dict()
    for name, tensor in merged.items():  # the export at fit end is the base with the adapter merged
        torch.testing.assert_close(own[name], tensor, rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.parametrize("method", ["dpo", "grpo", "dpo:file"])
def test_resume_from_the_sharded_checkpoint_is_bitwise_exact(fsdp2_run, method):
    resume = fsdp2_run[0][method]["resume"]
    if method == "dpo:file":  # save_distributed_checkpoint: false
        assert resume["ckpt_is_file"], "one consolidated file"
    else:
        assert resume["ckpt_is_dir"], "an FSDP2 checkpoint is a directory of shards"
    assert (resume["stopped_at"], resume["global_step"], resume["straight_step"]) == (2, 3, 3)
    assert resume["compared"] > 0 and resume["moved"]
    assert resume["resume_equal"], f"differ after resuming: {resume['differ']}"


def test_export_at_fit_end_and_from_the_sharded_checkpoint_hold_the_trained_weights(fsdp2_run, tmp_path):
    dpo = fsdp2_run[0]["dpo"]
    full = _hf_names(torch.load(dpo["policy_pt"])["full"])  # consolidated by the strategy's own reader
    _assert_same(AutoModelForCausalLM.from_pretrained(dpo["export_dir"]), full)
    assert dpo["ckpt_is_dir"]
    export_main([dpo["ckpt"], str(tmp_path / "hf")])  # consolidated from the shards in one process
    _assert_same(AutoModelForCausalLM.from_pretrained(tmp_path / "hf"), full)


def test_vllm_weight_gather_hands_out_the_whole_tensors(fsdp2_run):
    for rank in (0, 1):
        assert fsdp2_run[rank]["dpo"]["gathered_is_plain"], rank
    saved = torch.load(fsdp2_run[0]["dpo"]["policy_pt"])
    full, gathered = _hf_names(saved["full"]), saved["gathered"]
    assert set(full) <= set(gathered)
    for name, tensor in full.items():
        assert torch.equal(gathered[name], tensor), name


def test_a_consolidated_checkpoint_file_exports_the_trained_weights(fsdp2_run, tmp_path):
    job = fsdp2_run[0]["dpo:file"]
    export_main([job["resume"]["ckpt"], str(tmp_path / "hf")])  # saved when the fit ended
    at_fit_end = AutoModelForCausalLM.from_pretrained(job["export_dir"]).state_dict()
    _assert_same(AutoModelForCausalLM.from_pretrained(tmp_path / "hf"), at_fit_end)


def test_lightning_clips_the_sharded_gradients(fsdp2_run):
    for rank in (0, 1):
        for job in ("sft", "dpo", "dpo:lora"):
            clip = fsdp2_run[rank][job]["clip"]
            assert len(clip["before"]) == 2 and min(clip["before"]) > clip["value"], (rank, job, clip)
            assert clip["after"] == pytest.approx([clip["value"]] * 2, rel=1e-3), (rank, job, clip)


# --------------------------------------------------------------------------------------------
# in one process, without a fit
# --------------------------------------------------------------------------------------------


def test_data_parallel_size_auto_is_every_process():
    """Lightning 2.6 resolves `data_parallel_size: auto` to the number of nodes (1 here): the
    overlay's `auto` must become the world size before the mesh is built (`lit_rlhf.cli` calls
    this on the Trainer it builds)."""
    import lightning as L
    from lightning.pytorch.strategies import ModelParallelStrategy

    from lit_rlhf.training.sharding import resolve_data_parallel_size

    strategy = ModelParallelStrategy(data_parallel_size="auto", tensor_parallel_size=1)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False, enable_checkpointing=False)
    resolve_data_parallel_size(trainer)
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (2, 1)


def test_every_decoder_layer_is_a_unit_also_under_lora():
    from lit_rlhf import models
    from lit_rlhf.models import adapters
    from lit_rlhf.training.sharding import decoder_layers, shard_root

    tokenizer = models.load_tokenizer("tiny-random-llama")
    model = models.load_causal_lm("tiny-random-llama", tokenizer, "float32")
    layers = decoder_layers(model)
    assert layers and [type(m).__name__ for m in layers] == ["LlamaDecoderLayer"] * model.config.num_hidden_layers
    assert shard_root(model) is model
    lora = adapters.add_lora(model, adapters.lora_config({"r": 4, "alpha": 8}), adapters.POLICY)
    assert len(decoder_layers(lora)) == model.config.num_hidden_layers
    assert shard_root(lora) is lora.get_base_model()  # generate() and the adapter's forward both enter it


def test_a_value_adapter_on_the_policys_base_is_refused():
    """PPO with LoRA: the value is an adapter on the policy's own base, whose forward runs the
    base's decoder outside the policy's (sharded root's) forward."""
    from types import SimpleNamespace

    from lit_rlhf.modules import PPOModule
    from lit_rlhf.rewards import CharacterFractionReward
    from lit_rlhf.training.sharding import unsupported

    mesh = {"tensor_parallel": SimpleNamespace(size=lambda: 1)}
    trainer = SimpleNamespace(strategy=SimpleNamespace(device_mesh=mesh))
    ppo = PPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward("abc")], lora={"r": 4, "alpha": 8})
    problems = unsupported(ppo, trainer)
    assert len(problems) == 1 and problems[0].startswith("value_model: an adapter on the policy's base"), problems
    plain = PPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward("abc")])
    assert unsupported(plain, trainer) == []


def test_the_overlay_runs_from_the_command_line_in_two_processes(tmp_path):
    """`main.py fit --config <quickstart> --config configs/strategy/fsdp2.yaml` under torchrun: the
    overlay's `data_parallel_size: auto` becomes both processes (Lightning alone would build a
    1-process mesh and refuse the world of 2), the checkpoint is a directory of shards, and the
    export at fit end loads. The quickstart precomputes the reference log-probs: each rank scores
    its own rows of the train loader (`lit_rlhf.training.reference_table`)."""
    import os
    import subprocess
    import sys

    from tests.distributed.launch import REPO_ROOT, free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(REPO_ROOT / "main.py"), "fit", "--config", str(REPO_ROOT / "configs/quickstart/dpo.yaml"),
           "--config", str(REPO_ROOT / "configs/strategy/fsdp2.yaml"), "--trainer.accelerator=cpu",
           "--trainer.devices=2", "--trainer.max_steps=2", "--model.init_args.model=tiny-random-llama"]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = tmp_path / "outputs/quickstart/dpo/checkpoints/last.ckpt"
    assert last.is_dir() and (last / "meta.pt").is_file() and len(list(last.glob("*.distcp"))) == 2
    AutoModelForCausalLM.from_pretrained(tmp_path / "outputs/quickstart/dpo_model")
