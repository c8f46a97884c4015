"""optimizer_in_backward in the online methods' update loop (manual optimisation): each optimizer
step's minibatch is one backward pass, run as the step's closure. The same run as the usual step
(bitwise), and a clear refusal where a step would take several backward passes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lit_rlhf.training.memory import Memory
from lit_rlhf.modules import GRPOModule, PPOModule, SFTModule
from lit_rlhf.training import in_backward
from lit_rlhf.training.in_backward import InBackwardAdamW
from tests.modules.test_optimizer_in_backward import LiveGradients
from tests.resume.harness import Setup, checkpoint_values, fit

pytestmark = pytest.mark.usefixtures("one_thread")  # bitwise-reproducible CPU kernels

# no clipping (it needs every gradient at once), cosine decay after one warmup step, weight decay
PLAIN = dict(max_grad_norm=0.0, lr_scheduler="cosine", warmup_steps=1, weight_decay=0.1)


@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_same_run_as_the_whole_model_step(name, tmp_path):
    """GRPO (policy) and PPO (policy + value in one AdamW, 2 epochs x 2 minibatches per rollout):
    every weight, optimizer moment, scheduler state and logged scalar bitwise equal."""
    runs, values, trackers = [], [], []
    for in_backward in (False, True):
        root = tmp_path / ("ours" if in_backward else "plain")
        trackers.append(LiveGradients())
        run = fit(Setup(name, module_args={**PLAIN, "memory": Memory(optimizer_in_backward=in_backward)}), root, trackers[-1])
        assert run.exit_code is None and not run.killed
        runs.append(run)
        values.append(checkpoint_values(root / "checkpoints" / "last.ckpt"))
    plain, ours = values
    assert isinstance(runs[1].trainer.optimizers[0], InBackwardAdamW)
    assert runs[1].trainer.global_step == runs[0].trainer.global_step > 1
    assert any(k.startswith("optimizer_states/0/state/") for k in ours)
    different = [k for k in plain if not (torch.equal(plain[k], ours[k]) if isinstance(plain[k], torch.Tensor)
                                          else plain[k] == ours[k])]
    assert plain.keys() == ours.keys() and not different, different[:8]
    assert runs[0].recorder.metrics == runs[1].recorder.metrics
    plain_grads, ours_grads = trackers
    total = sum(p.nbytes for p in ours_grads.params)
    assert plain_grads.peak == total  # every gradient held until the step
    assert ours_grads.peak == max(p.nbytes for p in ours_grads.params) < total  # one at a time


def reward(prompts, completions, **_):
    return [0.0] * len(prompts)


@pytest.mark.parametrize("module_cls,args,batch_size,rows", [
    (GRPOModule, dict(num_generations=4, micro_batch_size=2), 2, 8),
    (GRPOModule, dict(num_generations=4, num_minibatches=2, micro_batch_size=3), 2, 4),
    (PPOModule, dict(num_minibatches=1, micro_batch_size=1), 2, 2),
])
def test_micro_batches_within_a_step_are_refused(module_cls, args, batch_size, rows):
    module = module_cls(model="tiny-random-llama", reward_fns=[reward], max_grad_norm=0.0, memory=Memory(optimizer_in_backward=True),
                        **args)
    trainer = SimpleNamespace(gradient_clip_val=None, accumulate_grad_batches=1, strategy=None, world_size=1,
                              precision="32-true", precision_plugin=SimpleNamespace(scaler=None))
    problems = in_backward.startup_problems(trainer, module, SimpleNamespace(batch_size=batch_size))
    assert len(problems) == 1, problems
    assert f"micro_batch_size={args['micro_batch_size']}" in problems[0] and f"minibatches of {rows} rows" in problems[0]
    whole = module_cls(model="tiny-random-llama", reward_fns=[reward], max_grad_norm=0.0, memory=Memory(optimizer_in_backward=True),
                       **{**args, "micro_batch_size": rows})
    assert in_backward.startup_problems(trainer, whole, SimpleNamespace(batch_size=batch_size)) == []
    clipped = module_cls(model="tiny-random-llama", reward_fns=[reward], memory=Memory(optimizer_in_backward=True),
                         **{**args, "micro_batch_size": None})  # max_grad_norm 1.0 by default
    assert ["max_grad_norm" in p for p in in_backward.startup_problems(trainer, clipped, None)] == [True]


def test_a_manual_module_without_the_update_loop_is_refused():
    class Manual(SFTModule):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.automatic_optimization = False

    module = Manual(model="tiny-random-llama", memory=Memory(optimizer_in_backward=True))
    trainer = SimpleNamespace(gradient_clip_val=None, accumulate_grad_batches=1, strategy=None, world_size=1,
                              precision="32-true", precision_plugin=SimpleNamespace(scaler=None))
    problems = in_backward.startup_problems(trainer, module, None)
    assert len(problems) == 1 and "Manual optimises manually" in problems[0], problems


def test_ppo_backward_per_network_equals_one_backward_of_the_sum(monkeypatch, tmp_path):
    """PPO's update runs the policy term's backward pass before the value model's forward pass
    (run_updates' loss parts: the policy's activations are freed first). The same run, bitwise,
    as one backward pass of policy + value loss (the parts computed first and summed, as under DDP)."""
    import lit_rlhf.modules.online as online_module

    parts_run = fit(Setup("ppo"), tmp_path / "parts")
    separate = online_module.loss_parts
    summed = []

    def one_backward(result, _separate=True):
        summed.append(True)
        return separate(result, False)

    monkeypatch.setattr(online_module, "loss_parts", one_backward)
    sum_run = fit(Setup("ppo"), tmp_path / "sum")
    parts, total = (checkpoint_values(tmp_path / name / "checkpoints" / "last.ckpt") for name in ("parts", "sum"))
    assert parts.keys() == total.keys() and any(k.startswith("optimizer_states/0/state/") for k in parts)
    different = [k for k in parts if not (torch.equal(parts[k], total[k]) if isinstance(parts[k], torch.Tensor)
                                          else parts[k] == total[k])]
    assert not different, different[:8]
    assert summed and parts_run.recorder.metrics == sum_run.recorder.metrics and parts_run.recorder.metrics[4]
