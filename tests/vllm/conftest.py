"""Fixtures of the vLLM backend tests: a tiny Llama vLLM's CPU attention runs (head size 32:
the library's tiny model has 16, below vLLM's minimum) and ONE engine per session, shared by
every test (building one takes ~10 s), and ONE server process (`server`); a test hands them its
own policy's weights.

Without the vllm package these tests are skipped, except where `LIT_RLHF_REQUIRE_VLLM=1` (CI,
`.ci/run`): there a missing vLLM fails them.
"""

from __future__ import annotations

import os

import pytest
import torch

from lit_rlhf.generation.vllm import vllm_available

if not vllm_available() and os.environ.get("LIT_RLHF_REQUIRE_VLLM") == "1":
    raise RuntimeError("LIT_RLHF_REQUIRE_VLLM=1 but vllm does not import: bash scripts/install.sh installs it")


def pytest_collection_modifyitems(config, items):
    if vllm_available():
        return
    here = os.path.dirname(__file__)
    skip = pytest.mark.skip(reason="vllm is not installed (bash scripts/install.sh installs it; CI requires it)")
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory):
    """A tiny random Llama (hidden 64, 2 heads of 32, 2 layers, tied embeddings) with the tiny tokenizer (PAD added)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lit_rlhf.models import load_tokenizer

    tokenizer = load_tokenizer("tiny-random-llama")
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,  # as SmolLM2: the tied output layer must follow syncs
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    path = tmp_path_factory.mktemp("tiny-llama-hd32")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def engine(vllm_model_dir):
    """The session's vLLM engine (its weights are whatever the last test loaded)."""
    from lit_rlhf.generation.vllm import VLLMEngine
    from lit_rlhf.models import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(vllm_model_dir)
    policy = load_causal_lm(vllm_model_dir, tokenizer, dtype="float32")
    return VLLMEngine.from_policy(policy, tokenizer, max_model_len=1024)  # the calculator's system prompt: ~660 tokens


def attach(module, engine):
    """Give `module` the shared engine; it loads the module's policy weights on its first rollout."""
    engine.synced_step = None
    source = module.rollout_source
    getattr(source, "sampler", source).engine = engine  # an environment's turns: its sampler's engine
    return module


@pytest.fixture(scope="session")
def server(vllm_model_dir, tmp_path_factory):
    """ONE vLLM server process per session (a CPU server starts in ~1 min), float32, serving LoRA
    adapters up to rank 8; a test pushes its own weights first."""
    from lit_rlhf.generation.server import VLLMServer

    started = VLLMServer.start(vllm_model_dir, tmp_path_factory.mktemp("server") / "vllm_server.log",
                               startup_timeout=900, dtype="float32", max_model_len=256, lora_rank=8)
    yield started
    started.stop()


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every vLLM test on one torch thread (tests/conftest.py)."""
    yield
