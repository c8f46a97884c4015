"""A vLLM server's weight sync checked by the probe (`ServerClient.check_probe`): the server's
log-probs of the probe's tokens after loading a version against the trainer's."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.generation.server import ServerClient, VLLMServer
from lit_rlhf.generation.sync_check import SyncCheckError, SyncProbe
from lit_rlhf.generation.weight_sync import FileWeightSync
from lit_rlhf.models import load_causal_lm, load_tokenizer

@pytest.fixture(scope="module")
def server(vllm_model_dir, tmp_path_factory):
    started = VLLMServer.start(vllm_model_dir, tmp_path_factory.mktemp("server") / "vllm_server.log",
                               startup_timeout=900, dtype="float32", max_model_len=256)
    yield started
    started.stop()

def test_the_server_s_sync_is_checked_by_the_probe(server, vllm_model_dir, tmp_path):
    client = ServerClient(server, vllm_model_dir, timeout=120)
    policy = load_causal_lm(vllm_model_dir, load_tokenizer(vllm_model_dir), dtype="float32").eval()
    probe, files = SyncProbe(policy.config.vocab_size), FileWeightSync(tmp_path)
    weights = {n: p.detach() for n, p in policy.named_parameters()}
    files.publish(1, weights)
    client.load_weights_file(files.path(1), 1)
    assert client.check_probe(probe, 1, probe.logps(policy), torch.float32) < 1e-4
    moved = dict(weights, **{"model.layers.1.mlp.down_proj.weight": weights["model.layers.1.mlp.down_proj.weight"] * 3})
    files.publish(2, moved)
    client.load_weights_file(files.path(2), 2)  # the server now holds other weights than the trainer
    with pytest.raises(SyncCheckError, match="vLLM server sync: after the sync of version 2"):
        client.check_probe(probe, 2, probe.logps(policy), torch.float32)
