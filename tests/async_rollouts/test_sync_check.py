"""A weight sync that proves itself (`lit_rlhf.generation.sync_check`): the engine's log-probs of
a fixed probe after the sync against the trainer's, through the in-memory and the file syncs.
A healthy sync passes; a dropped tensor, a LoRA adapter left unmerged and a bf16 truncation each
raise `SyncCheckError` naming the sync and the version."""

from __future__ import annotations

import copy

import pytest
import torch

from lit_rlhf.generation.sync_check import SyncCheckError, SyncProbe
from lit_rlhf.generation.weight_sync import PROBE_KEY, FileWeightSync, InMemoryWeightSync, load_weights, trained_weights
from lit_rlhf.models import adapters, load_causal_lm, merging

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture()
def base(tiny_tokenizer):
    """The tiny model with its weights scaled x4, so its logits spread as a trained model's do."""
    model = load_causal_lm("tiny-random-llama", tiny_tokenizer).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4)
    return model


def _trained(model):
    """`model` after a pretend update: every trained weight moved."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


def _sync(kind, tmp_path):
    return InMemoryWeightSync() if kind == "in-memory" else FileWeightSync(tmp_path)


def load_checked(engine, stamped, probe, sync, version):
    """What a sampler does with a version it fetched (`Sampler.prepare`): load the weights, then
    check the probe when the learner stamped it."""
    tensors = dict(stamped)
    expected = tensors.pop(PROBE_KEY, None)
    load_weights(engine, tensors)
    if expected is not None:
        probe.verify_model(sync, version, engine, expected)


@pytest.mark.parametrize("kind", ["in-memory", "file"])
def test_a_healthy_sync_passes_and_a_broken_one_raises(base, tmp_path, kind):
    engine, trainer = copy.deepcopy(base), _trained(copy.deepcopy(base))
    probe, sync = SyncProbe(trainer.config.vocab_size), _sync(kind, tmp_path)
    weights = trained_weights(trainer)
    broken = {
        2: {n: t for n, t in weights.items() if n != "model.layers.1.mlp.down_proj.weight"},  # a tensor dropped
        3: {n: t.bfloat16() for n, t in weights.items()},  # a bf16 cast on the way
    }
    for version, tensors in broken.items():
        sync.publish(version, probe.stamp(tensors, trainer))
        with pytest.raises(SyncCheckError, match=f"{kind} sync: after the sync of version {version} .* worst: row"):
            load_checked(engine, sync.fetch(version, 5.0), probe, f"{kind} sync", version)
    sync.publish(4, probe.stamp(weights, trainer))
    load_checked(engine, sync.fetch(4, 5.0), probe, f"{kind} sync", 4)
    assert 0 < probe.seconds < 5
    # an unstamped version (no probe log-probs sent) loads unchecked, as before
    sync.publish(5, broken[2])
    load_checked(engine, sync.fetch(5, 5.0), probe, f"{kind} sync", 5)


def test_a_lora_adapter_left_unmerged_raises(base, tmp_path):
    engine = copy.deepcopy(base)  # a plain model: it receives the base with the adapter merged
    trainer = adapters.add_lora(copy.deepcopy(base), adapters.lora_config({"r": 4}))
    with torch.no_grad():
        for name, p in trainer.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2, generator=torch.Generator().manual_seed(2))  # a trained adapter
    probe, sync = SyncProbe(base.config.vocab_size), FileWeightSync(tmp_path)
    names = dict(engine.named_parameters())
    merged = {n: t for n, t in merging.merged_weights(trainer, adapters.POLICY) if n in names}
    unmerged = {n: t.detach() for n, t in base.named_parameters()}
    sync.publish(1, probe.stamp(unmerged, trainer))
    with pytest.raises(SyncCheckError, match="version 1"):
        load_checked(engine, sync.fetch(1, 5.0), probe, "file sync", 1)
    sync.publish(2, probe.stamp(merged, trainer))
    load_checked(engine, sync.fetch(2, 5.0), probe, "file sync", 2)


def test_the_check_by_hand():
    probe = SyncProbe(10, rows=2, prompt=3, tokens=2, bound=0.1)
    expected = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]])
    assert probe.check("s", 7, expected, expected + 0.05, torch.float32) == pytest.approx(0.05)
    token = int(probe.input_ids[1, -1])
    with pytest.raises(SyncCheckError, match=rf"s: .* version 7 .* 0\.15 nats per token .* row 1, probe token 1 \(id {token}\)"):
        probe.check("s", 7, expected, expected + torch.tensor([[0.0, 0.0], [0.0, 0.6]]), torch.float32)
    with pytest.raises(SyncCheckError):  # a NaN is a failure, never a pass
        probe.check("s", 7, expected, expected * float("nan"), torch.float32)
    default = SyncProbe(10, rows=2, prompt=3, tokens=2)  # the bound by the trainer's dtype (measured, module docstring)
    assert default.check("s", 1, expected, expected + 0.4, torch.bfloat16) == pytest.approx(0.4)
    for dtype, gap, bound in ((torch.bfloat16, 0.6, "0.5"), (torch.float32, 2e-3, "0.001")):
        with pytest.raises(SyncCheckError, match=f"bound {bound}\\)"):
            default.check("s", 1, expected, expected + gap, dtype)


def test_the_asynchronous_producer_checks_every_version_it_loads(base):
    """`AsyncRollouts`' in-process sampler holds the learner's probe: a version stamped by the
    learner loads when the weights arrived whole, and a version missing a tensor raises."""
    import threading

    from lit_rlhf.async_rollouts import LocalSampler
    from lit_rlhf.generation import SamplingConfig

    trainer = _trained(copy.deepcopy(base))
    probe, sync = SyncProbe(trainer.config.vocab_size), InMemoryWeightSync()
    sampler = LocalSampler(copy.deepcopy(base), sync, SamplingConfig(max_new_tokens=2), 1, 0, 1, 0, probe=probe)
    weights, stop = trained_weights(trainer), threading.Event()
    sync.publish(1, probe.stamp(weights, trainer))
    assert sampler.prepare(1, stop) and sampler.version == 1
    sync.publish(2, probe.stamp({n: t for n, t in weights.items() if "layers.0.self_attn" not in n}, _trained(trainer)))
    with pytest.raises(SyncCheckError, match="asynchronous producer.*version 2"):
        sampler.prepare(2, stop)


@pytest.mark.parametrize("retry", [False, True])
def test_a_sampler_loads_a_failed_version_again_once_when_configured(base, retry):
    """`SyncProbe(retry=True)`: a version whose first load lost a tensor is loaded again and
    passes; without it the first failure stops the run."""
    import threading

    from lit_rlhf.async_rollouts import LocalSampler
    from lit_rlhf.generation import SamplingConfig

    class FlakyOnce(LocalSampler):
        loads = 0

        def load(self, version, tensors):
            self.loads += 1
            super().load(version, {n: t for n, t in tensors.items() if self.loads > 1 or "layers.1.mlp" not in n})

    trainer = _trained(copy.deepcopy(base))
    probe, sync = SyncProbe(trainer.config.vocab_size, retry=retry), InMemoryWeightSync()
    sampler = FlakyOnce(copy.deepcopy(base), sync, SamplingConfig(max_new_tokens=2), 1, 0, 1, 0, probe=probe)
    sync.publish(1, probe.stamp(trained_weights(trainer), trainer))
    if not retry:
        with pytest.raises(SyncCheckError, match="asynchronous producer.*version 1"):
            sampler.prepare(1, threading.Event())
        return
    assert sampler.prepare(1, threading.Event()) and sampler.version == 1 and sampler.loads == 2
