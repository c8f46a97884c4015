"""The subclassing example (examples/simpo.py) runs through the CLI with its config and learns."""

from __future__ import annotations

import math

import torch

from examples.simpo import SimPOModule, simpo_loss
from lit_rlhf.training.memory import Memory

REPO_CONFIG = "examples/simpo.yaml"


def test_simpo_loss_by_hand():
    out = simpo_loss(torch.tensor([-4.0, -9.0]), torch.tensor([-6.0, -3.0]), torch.tensor([2.0, 3.0]),
                     torch.tensor([3.0, 1.0]), beta=2.0, gamma=0.5)
    # pair 0: r_w = 2*-4/2 = -4, r_l = 2*-6/3 = -4 -> h = -0.5; pair 1: r_w = -6, r_l = -6 -> h = -0.5
    assert math.isclose(out.loss.item(), -math.log(1 / (1 + math.exp(0.5))), rel_tol=1e-6)
    assert out.margins.item() == 0.0 and out.accuracy.item() == 0.0


def test_simpo_example_fits_through_the_cli(tmp_path):
    from lit_rlhf.cli import main

    torch.set_num_threads(1)
    cli = main([
        "fit", "--config", REPO_CONFIG, "--trainer.max_steps=6", "--trainer.max_epochs=-1",
        "--trainer.accelerator=cpu", "--trainer.precision=32", "--trainer.devices=1",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger=false", "--trainer.callbacks=[]",
        "--trainer.enable_checkpointing=false", "--trainer.limit_val_batches=0",
        "--model.init_args.model=tiny-random-llama", "--model.init_args.lr=5e-3",
        "--model.init_args.warmup_ratio=0", "--model.init_args.lr_scheduler=constant",
        f"--model.init_args.export_dir={tmp_path / 'hf'}",
        "--data.init_args.path=bundled:tldr_comparisons", "--data.init_args.limit=4", "--data.init_args.batch_size=4",
        "--data.init_args.max_prompt_length=96", "--data.init_args.max_completion_length=256",
        "--data.init_args.val_split=null",
    ])
    module, trainer = cli.model, cli.trainer
    assert isinstance(module, SimPOModule) and trainer.global_step == 6
    assert (tmp_path / "hf" / "config.json").is_file()  # inherited export
    # it learns: on the same 4 pairs, the length-normalised margin grows and the loss falls
    batch = next(iter(trainer.datamodule._loader("train", shuffle=False)))  # the 4 training pairs, in order
    fresh = SimPOModule(model="tiny-random-llama")
    with torch.no_grad():
        (loss_before, before), (loss_after, after) = fresh.compute_loss(batch), module.compute_loss(batch)
    assert loss_after < loss_before and after["rewards/margins"] > before["rewards/margins"]


def test_simpo_example_computes_each_pair_prompt_once(tiny_tokenizer, monkeypatch):
    """`pair_logps` passes the pairs' sharing on: with `shared_prompt` the policy runs once on
    the shared-prompt layout, and loss and gradients equal the padded rows'."""
    from lit_rlhf.models import shared_prompt as sp
    from tests.modules.test_dpo_module import perturb, preference_batch

    calls, build = [], sp.build_layout
    monkeypatch.setattr(sp, "build_layout", lambda *a, **k: calls.append(1) or build(*a, **k))
    results = []
    for shared in (False, True):
        module = SimPOModule(memory=Memory(shared_prompt=shared))
        perturb(module.policy, seed=1)
        loss, stats = module.compute_loss(preference_batch(tiny_tokenizer))
        loss.backward()
        grads = {n: p.grad for n, p in module.policy.named_parameters() if p.grad is not None}
        results.append((loss.detach(), stats["rewards/margins"], grads))
        assert len(calls) == int(shared)
    (loss_a, margin_a, grads_a), (loss_b, margin_b, grads_b) = results
    torch.testing.assert_close(loss_b, loss_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(margin_b, margin_a, atol=1e-5, rtol=0)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], atol=1e-5, rtol=1e-4, msg=name)



BEAT_GREEDY_CONFIG = "examples/beat_greedy.yaml"


def test_docs_show_the_online_example_as_it_is_run():
    """The online example of docs/guides/new-method.md is examples/beat_greedy.py's class, line for line."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    page = (root / "docs" / "guides" / "new-method.md").read_text()
    start = page.index("class BeatGreedySFTModule(OnlineModule):")
    shown = page[start: page.index("```", start)].rstrip()
    assert shown in (root / "examples" / "beat_greedy.py").read_text()
    assert "stats[\"rewards/kept_fraction\"]" in shown  # the whole class, to its last line


def online_example_args(config: str, root, steps: int, *extra: str) -> list[str]:
    """`main.py fit` arguments of an online example's YAML on the tiny model with a letters reward
    (no reward model), 8 tokens at temperature 1, 16 TL;DR prompts in batches of 8, no logger."""
    return [
        "fit", "--config", config, f"--trainer.max_steps={steps}", "--trainer.accelerator=cpu",
        "--trainer.precision=32", "--trainer.devices=1", "--trainer.default_root_dir", str(root),
        "--trainer.logger=false", "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
        "--trainer.callbacks=[]", "--trainer.enable_checkpointing=false",
        "--model.init_args.model=tiny-random-llama", "--model.init_args.reward_model=null",
        "--model.init_args.reward_fns=[{class_path: lit_rlhf.rewards.CharacterFractionReward}]",
        "--model.init_args.max_new_tokens=8", "--model.init_args.temperature=1.0", "--model.init_args.lr=1e-2",
        "--model.init_args.lr_scheduler=constant", "--model.init_args.total_episodes=null",
        "--model.init_args.micro_batch_size=null", *extra,
        "--data.init_args.path=bundled:tldr_sft", "--data.init_args.limit=16", "--data.init_args.batch_size=8",
        "--data.init_args.max_prompt_length=96", "--data.init_args.val_split=null", "--data.init_args.test_split=null",
    ]


def test_beat_greedy_example_fits_through_the_cli(tmp_path):
    """The online example runs from its YAML (tiny model, a letters reward instead of the reward
    model): it computes no rollout log-probs, logs the share of samples kept, and it learns."""
    from examples.beat_greedy import BeatGreedySFTModule
    from lit_rlhf.cli import main

    torch.set_num_threads(1)
    cli = main(online_example_args(BEAT_GREEDY_CONFIG, tmp_path, 8, f"--model.init_args.export_dir={tmp_path / 'hf'}"))
    module, trainer = cli.model, cli.trainer
    assert isinstance(module, BeatGreedySFTModule) and trainer.global_step == 8
    assert (tmp_path / "hf" / "config.json").is_file()  # inherited export
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert 0 <= metrics["train/rewards/kept_fraction"] <= 1 and "train/objective/entropy" not in metrics
    # it learns: the policy's expected share of letters on held-out prompts rises
    from tests.learning.tasks import expected_letter_reward, make_prompts

    fresh = BeatGreedySFTModule(model="tiny-random-llama", reward_fns=[lambda p, c: [0.0] * len(c)], temperature=0.7)
    assert fresh.logprob_temperature == 1.0 and module.logprob_temperature == 1.0  # pinned, whatever it samples at
    held_out = make_prompts(8, 1000)
    before = expected_letter_reward(fresh.policy, fresh.tokenizer, held_out, 8, 1.0)
    after = expected_letter_reward(module.policy, module.tokenizer, held_out, 8, 1.0)
    print(f"beat_greedy: expected letter reward {before:.4f} -> {after:.4f}")
    assert after > before + 0.02, (before, after)


REBEL_CONFIG = "examples/rebel.yaml"


def test_rebel_loss_by_hand():
    from examples.rebel import rebel_loss

    logps = torch.tensor([[-3.0, -5.0], [-2.0, -2.0]])
    old = torch.tensor([[-4.0, -4.0], [-2.0, -3.0]])
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.5]])
    out = rebel_loss(logps, old, rewards, eta=2.0)
    # pair 0: log-ratios (1, -1) -> predicted (1 - -1) / 2 = 1, target 1 -> 0
    # pair 1: log-ratios (0, 1) -> predicted -1 / 2 = -0.5, target -0.5 -> 0; then a miss of 1 on pair 0:
    assert out.loss.item() == 0.0 and out.predicted.tolist() == [1.0, -0.5] and out.target.tolist() == [1.0, -0.5]
    missed = rebel_loss(logps, old, rewards + torch.tensor([[1.0, 0.0], [0.0, 0.0]]), eta=2.0)
    assert math.isclose(missed.loss.item(), (1.0 ** 2 + 0.0) / 2)


def test_rebel_example_fits_through_the_cli_and_learns(tmp_path):
    """The second online example runs from its YAML (tiny model, a letters reward): pairs, two
    passes per rollout, and the policy's expected share of letters on held-out prompts rises."""
    from examples.rebel import REBELModule
    from lit_rlhf.cli import main

    torch.set_num_threads(1)
    cli = main(online_example_args(REBEL_CONFIG, tmp_path, 16, "--model.init_args.eta=10.0"))  # eta: measured, seeds 1-3
    module, trainer = cli.model, cli.trainer
    assert isinstance(module, REBELModule) and trainer.global_step == 16 and module.rollouts == 8  # 2 passes each
    from tests.learning.tasks import expected_letter_reward, make_prompts

    fresh = REBELModule(model="tiny-random-llama", reward_fns=[lambda p, c: [0.0] * len(c)])
    held_out = make_prompts(8, 1000)
    before = expected_letter_reward(fresh.policy, fresh.tokenizer, held_out, 8, 1.0)
    after = expected_letter_reward(module.policy, module.tokenizer, held_out, 8, 1.0)
    print(f"rebel: expected letter reward {before:.4f} -> {after:.4f}")
    assert after > before + 0.02, (before, after)
