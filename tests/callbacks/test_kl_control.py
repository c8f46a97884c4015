"""KLControlCallback: Ziegler et al. (2019) adaptive update by hand, the rollout hook, checkpoints,
and the typed hook it controls (`OnlineModule.kl_coef` / `set_kl_coef`)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from callbacks import KLControlCallback
from lit_rlhf.modules.online import OnlineModule
from lit_rlhf.types import Rollout


class _Module(OnlineModule):
    """An `OnlineModule` with only what the callback touches: `kl_coef`, `set_kl_coef`, a reference
    model (or none) and `log` (no policy is loaded)."""

    def __init__(self, kl_coef: float = 0.0, reference: bool = True):
        torch.nn.Module.__init__(self)
        self.ref_model = torch.nn.Identity() if reference else None
        self.kl_coef = kl_coef
        self.logged = {}

    def log(self, name, value, **kwargs):
        self.logged[name] = float(value)


class _NotOnline:
    kl_coef = 0.1
    beta = 0.1


class _Strategy:
    def reduce(self, value, reduce_op="mean"):
        return value


def _trainer():
    return SimpleNamespace(strategy=_Strategy(), world_size=1)


def _rollout(logps, ref_logps, mask):
    n, r = logps.shape
    return Rollout(
        prompt_ids=torch.zeros(n, 2, dtype=torch.long), prompt_mask=torch.ones(n, 2, dtype=torch.bool),
        response_ids=torch.zeros(n, r, dtype=torch.long), response_attention_mask=mask, has_eos=torch.ones(n, dtype=torch.bool),
        logps=logps, ref_logps=ref_logps, scores=torch.zeros(n),
    )


@pytest.mark.parametrize(
    "kl, expected_error",
    [(9.0, 0.2), (3.0, -0.2), (6.6, 0.1), (6.0, 0.0), (0.0, -0.2)],  # e = clip(KL/6 - 1, -0.2, 0.2)
)
def test_adaptive_update_by_hand(kl, expected_error):
    cb = KLControlCallback(init_kl_coef=0.1, target=6.0, horizon=10000)
    new = cb.update(kl, n_steps=64)
    assert math.isclose(new, 0.1 * (1 + expected_error * 64 / 10000), rel_tol=1e-12)
    # a second update compounds from the new value
    assert math.isclose(cb.update(kl, 64), new * (1 + expected_error * 64 / 10000), rel_tol=1e-12)


def test_fixed_control_never_moves():
    cb = KLControlCallback(init_kl_coef=0.05)
    assert cb.update(100.0, 512) == 0.05


def test_hook_measures_kl_and_updates_after_the_step():
    module = _Module(kl_coef=0.2)
    cb = KLControlCallback(target=1.0, horizon=100)  # init from the module's own kl_coef
    trainer = _trainer()
    cb.on_train_start(trainer, module)
    assert cb.kl_coef == 0.2
    mask = torch.tensor([[True, True, False], [True, True, True]])
    logps = torch.tensor([[-1.0, -1.0, 0.0], [-0.5, -0.5, -0.5]])
    ref = torch.tensor([[-2.0, -1.5, 0.0], [-0.5, -1.0, -1.0]])
    # per-response k1 sums: 1.5 and 1.0 -> KL = 1.25; e = clip(0.25) = 0.2; n_steps = 2 responses
    rollout = _rollout(logps, ref, mask)
    cb.on_rollout_end(trainer, module, rollout)
    assert module.kl_coef == 0.2  # this rollout's rewards use the old coefficient
    cb.on_train_batch_end(trainer, module, None, None, 0)
    assert module.logged["train/objective/kl_coef"] == pytest.approx(0.2)
    assert module.kl_coef == pytest.approx(0.2 * (1 + 0.2 * 2 / 100))
    assert cb.kl_coef == module.kl_coef


def test_sets_the_coefficient_through_the_typed_hook_and_checks_the_reference(monkeypatch):
    module = _Module(kl_coef=0.04)
    set_to = []
    hook = OnlineModule.set_kl_coef
    monkeypatch.setattr(OnlineModule, "set_kl_coef", lambda self, value: set_to.append(value) or hook(self, value))
    cb = KLControlCallback(init_kl_coef=0.1, target=2.0, horizon=10)
    cb.on_train_start(_trainer(), module)
    assert module.kl_coef == 0.1 and set_to == [0.1]
    no_ref = _rollout(torch.zeros(2, 2), None, torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="reference log-probs"):
        cb.on_rollout_end(_trainer(), module, no_ref)
    with pytest.raises(ValueError, match="coefficient of 0"):
        KLControlCallback(target=2.0).on_train_start(_trainer(), _Module(kl_coef=0.0))
    with pytest.raises(TypeError, match="OnlineModule"):  # no attribute found by its name
        KLControlCallback().on_train_start(_trainer(), _NotOnline())
    with pytest.raises(ValueError, match="target"):
        KLControlCallback(target=0.0)


def test_set_kl_coef_refuses_negatives_and_a_missing_reference():
    module = _Module(kl_coef=0.0, reference=False)  # GRPO/RLOO built with kl_coef 0 load no reference
    module.set_kl_coef(0.0)
    with pytest.raises(ValueError, match="loaded no reference model"):
        module.set_kl_coef(0.1)
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        _Module().set_kl_coef(-0.1)
    with pytest.raises(ValueError, match="loaded no reference model"):
        KLControlCallback(init_kl_coef=0.1).on_train_start(_trainer(), module)


def test_every_online_method_names_its_coefficient_kl_coef():
    import inspect

    from lit_rlhf.modules import GRPOModule, PPOModule, RLOOModule

    for cls, default in ((PPOModule, 0.05), (GRPOModule, 0.04), (RLOOModule, 0.05)):
        params = inspect.signature(cls.__init__).parameters
        assert params["kl_coef"].default == default and "beta" not in params, cls.__name__


def test_state_dict_round_trip_restores_the_module():
    cb = KLControlCallback(init_kl_coef=0.1, target=6.0, horizon=10000)
    cb.update(9.0, 1000)
    state = cb.state_dict()
    resumed = KLControlCallback(init_kl_coef=0.1, target=6.0, horizon=10000)
    resumed.load_state_dict(state)
    module = _Module(kl_coef=0.1)
    resumed.on_train_start(_trainer(), module)
    assert module.kl_coef == pytest.approx(0.1 * 1.02)


def test_adaptive_control_names_a_method_without_rollout_log_probs():
    """A method whose rollout carries no policy log-probs (`needs_rollout_logps` False and an
    update that does not fill them) cannot be KL-controlled: a clear error, not a crash in masked_sum."""
    module = _Module(kl_coef=0.2)
    cb = KLControlCallback(target=1.0, horizon=100)
    cb.on_train_start(_trainer(), module)
    mask = torch.ones(2, 3, dtype=torch.bool)
    rollout = _rollout(torch.zeros(2, 3), torch.zeros(2, 3), mask)._replace(logps=None)
    with pytest.raises(ValueError, match="needs the policy's log-probs.*_Module does not compute them"):
        cb.on_rollout_end(_trainer(), module, rollout)
