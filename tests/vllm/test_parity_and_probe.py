"""Through vLLM's CPU engine: the trainer's log-probs replaying top-k / top-p equal the engine's
`processed_logprobs`, and every sync's probe check passes when healthy and raises when the engine
holds other weights than the trainer."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.generation import SamplingConfig, sequence_token_logps
from lit_rlhf.generation.sync_check import SyncCheckError
from lit_rlhf.models import load_causal_lm, load_tokenizer

# fp32 on CPU: vLLM's kernels and transformers' differ by rounding only (1e-6 measured without a
# filter, tests/vllm/test_engine.py); a boundary token of the top-p nucleus flipping by that
# rounding is the one way to exceed it
VLLM_BOUND = 1e-4


@pytest.fixture(scope="module")
def setup(vllm_model_dir, engine):
    tokenizer = load_tokenizer(vllm_model_dir, padding_side="left")
    policy = load_causal_lm(vllm_model_dir, tokenizer, dtype="float32").eval()
    batch = tokenizer(["hello world", "a b c d e f", "x", "The cat sat"], return_tensors="pt", padding=True)
    engine.sync_weights(policy)
    return tokenizer, policy, batch.input_ids, batch.attention_mask.bool()


@pytest.mark.parametrize(("top_k", "top_p"), [(50, 1.0), (0, 0.9), (50, 0.9)])
def test_trainer_logps_replaying_the_filter_equal_vllm_s(setup, engine, top_k, top_p):
    tokenizer, policy, ids, mask = setup
    cfg = SamplingConfig(max_new_tokens=12, temperature=0.7, top_k=top_k, top_p=top_p)
    response, response_mask, _, sampler = engine.generate(ids, mask, cfg, tokenizer.eos_token_id, tokenizer.pad_token_id,
                                                          seeds=[1, 2, 3, 4])
    replayed = sequence_token_logps(policy, ids, mask, response, response_mask, 0.7, top_k=top_k, top_p=top_p)
    assert float((replayed - sampler)[response_mask].abs().max()) < VLLM_BOUND
    full = sequence_token_logps(policy, ids, mask, response, response_mask, 0.7)  # the replay off
    assert float((full - sampler)[response_mask].abs().min()) > 1e-3


def test_every_sync_checks_its_probe(setup, engine):
    tokenizer, policy, ids, mask = setup
    engine.sync_weights(policy, step=1)
    assert 0 < engine.probe.seconds < 30
    with torch.no_grad():
        policy.model.layers[1].mlp.down_proj.weight.mul_(3)  # the trainer moved; the engine was not told
    try:
        with pytest.raises(SyncCheckError, match="colocated vLLM sync: after the sync of version 2 .* worst: row"):
            engine.check_probe(policy, None, 2)
    finally:
        with torch.no_grad():
            policy.model.layers[1].mlp.down_proj.weight.div_(3)
