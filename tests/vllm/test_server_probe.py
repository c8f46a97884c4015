"""A vLLM server's weight sync checked by the probe: after each version the asynchronous
producer pushes (`ServerSampler.prepare`: a stamped file, or a LoRA adapter of its own), the
server scores the probe's tokens (prompt log-probs) and they are compared with the trainer's. A
healthy sync passes; a dropped tensor, a bf16 truncation and a LoRA adapter left unmerged each
raise `SyncCheckError` naming the sync, the version and the worst token. Runs on the session's
server (`conftest.server`)."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from lit_rlhf.async_rollouts.server_sampler import ServerSampler
from lit_rlhf.generation import SamplingConfig
from lit_rlhf.generation.server import ServerClient
from lit_rlhf.generation.sync_check import SyncCheckError, SyncProbe
from lit_rlhf.generation.weight_sync import InMemoryWeightSync, trained_weights
from lit_rlhf.models import adapters, load_causal_lm, load_tokenizer


def moved(model, seed, scale=1.0):
    """`model` with its weights scaled by `scale` (so its logits spread as a trained model's do)
    and every trained weight moved (a pretend update)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.mul_(scale).add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


def sampler(server, model_dir, tmp_path, probe, lora_config=None):
    tokenizer = load_tokenizer(model_dir)
    return ServerSampler(ServerClient(server, model_dir, timeout=120), InMemoryWeightSync(),
                         SamplingConfig(max_new_tokens=2), 1, tokenizer.eos_token_id, tokenizer.pad_token_id, 0,
                         lora_config, workdir=tmp_path, probe=probe)


def push(producer, probe, version, tensors, trainer):
    """The learner publishes `version` stamped with its probe log-probs; the producer loads it."""
    producer.sync.publish(version, probe.stamp(tensors, trainer))
    return producer.prepare(version, threading.Event())


def test_every_version_pushed_to_the_server_is_checked(server, vllm_model_dir, tmp_path):
    base = load_causal_lm(vllm_model_dir, load_tokenizer(vllm_model_dir), dtype="float32").eval()
    trainer = moved(copy.deepcopy(base), 1, scale=4.0)
    probe = SyncProbe(base.config.vocab_size)
    producer = sampler(server, vllm_model_dir, tmp_path, probe)
    assert push(producer, probe, 1, trained_weights(trainer), trainer) and producer.version == 1
    assert 0 < probe.seconds < 30
    moved(trainer, 2)
    weights = trained_weights(trainer)
    broken = {
        2: {n: t for n, t in weights.items() if n != "model.layers.1.mlp.down_proj.weight"},  # a tensor dropped
        3: {n: t.bfloat16() for n, t in weights.items()},  # a bf16 cast on the way
    }
    for version, tensors in broken.items():
        with pytest.raises(SyncCheckError, match=rf"vLLM server sync \(file\): after the sync of version {version} "
                                                 r".* worst: row \d, probe token \d \(id \d+\)"):
            push(producer, probe, version, tensors, trainer)
        assert producer.version == 1
    assert push(producer, probe, 4, weights, trainer) and producer.version == 4


def test_a_lora_adapter_is_checked_as_served_and_an_unmerged_one_raises(server, vllm_model_dir, tmp_path):
    """The trainer's LoRA policy: its adapter served as a LoRA model of its own passes (also when
    the server already serves that version's name); the base sent as full weights without the
    adapter merged raises."""
    base = moved(load_causal_lm(vllm_model_dir, load_tokenizer(vllm_model_dir), dtype="float32").eval(), 3, 4.0)
    trainer = adapters.add_lora(copy.deepcopy(base), adapters.lora_config({"r": 4}))
    with torch.no_grad():
        for name, p in trainer.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2, generator=torch.Generator().manual_seed(4))  # a trained adapter
    probe = SyncProbe(base.config.vocab_size)
    full = sampler(server, vllm_model_dir, tmp_path / "full", probe)
    unmerged = {n: t.detach() for n, t in base.named_parameters()}
    with pytest.raises(SyncCheckError, match="vLLM server sync \\(file\\): after the sync of version 1 "):
        push(full, probe, 1, unmerged, trainer)
    assert push(full, probe, 2, unmerged, base)  # the server now holds the trainer's base
    lora = sampler(server, vllm_model_dir, tmp_path / "lora", probe, trainer.peft_config[adapters.POLICY])
    assert push(lora, probe, 3, trained_weights(trainer), trainer) and lora.model_name == "policy-v3"
    assert push(lora, probe, 4, trained_weights(trainer), trainer) and lora.model_name == "policy-v4"
    # a run resumed against the same server: a new sampler pushes a version the server already serves
    resumed = sampler(server, vllm_model_dir, tmp_path / "resumed", probe, trainer.peft_config[adapters.POLICY])
    assert push(resumed, probe, 4, trained_weights(trainer), trainer) and resumed.model_name == "policy-v4"
