"""build_adamw: fused torch AdamW where it can be, DeepSpeed's CPU Adam when ZeRO offloads the optimizer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.strategies import DeepSpeedStrategy

from lit_rlhf.training.optim import build_adamw, decay_groups, offloads_optimizer

HYPER = {"lr": 1e-2, "eps": 1e-5, "betas": (0.9, 0.95), "weight_decay": 0.1}


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 1))


def train(optimizer_of, steps=5):
    net = model()
    optimizer = optimizer_of(decay_groups(net, HYPER["weight_decay"]))
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        net(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return optimizer, torch.cat([p.detach().flatten() for p in net.parameters()])


def test_cpu_parameters_get_the_fused_kernel_with_the_same_updates():
    fused, weights = train(lambda groups: build_adamw(groups, None, **HYPER))
    assert fused.defaults["fused"] is True
    assert [g["weight_decay"] for g in fused.param_groups] == [0.1, 0.0]  # decay groups kept
    plain, reference = train(lambda groups: torch.optim.AdamW(groups, foreach=False, **HYPER))
    assert torch.allclose(weights, reference, atol=1e-6, rtol=0)


def test_zero_offload_gets_deepspeed_cpu_adam(monkeypatch):
    import deepspeed.ops.adam

    made = {}

    class RecordingCPUAdam:  # stands in for the compiled op: records how it was built
        def __init__(self, params, **kwargs):
            made.update(params=params, **kwargs)

    monkeypatch.setattr(deepspeed.ops.adam, "DeepSpeedCPUAdam", RecordingCPUAdam)
    offloaded = SimpleNamespace(strategy=DeepSpeedStrategy(stage=3, offload_optimizer=True))
    groups = decay_groups(model(), 0.1)
    optimizer = build_adamw(groups, offloaded, **HYPER)
    assert isinstance(optimizer, RecordingCPUAdam)
    assert made["params"] is groups and made["adamw_mode"] is True
    assert {k: made[k] for k in HYPER} == HYPER
    assert offloads_optimizer(offloaded)
    assert not offloads_optimizer(SimpleNamespace(strategy=DeepSpeedStrategy(stage=3)))
    assert not offloads_optimizer(None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_half_and_full_precision_weights_both_fuse(dtype):
    param = torch.nn.Parameter(torch.ones(3, dtype=dtype))
    optimizer = build_adamw([{"params": [param]}], None, **HYPER)
    param.grad = torch.ones(3, dtype=dtype)
    optimizer.step()
    assert optimizer.defaults["fused"] is True and bool((param < 1).all())
