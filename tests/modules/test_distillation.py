"""`DistillationModule`: the teacher (frozen, out of checkpoints, the student's tokenizer, a
privileged context on its prompt only), its settings' refusals, and one fit through the CLI from
`configs/quickstart/distill.yaml`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lit_rlhf.cli import main
from lit_rlhf.data.collate import PromptCollator
from lit_rlhf.models import adapters, load_causal_lm, load_tokenizer
from lit_rlhf.models.distillation import tokenizer_differences, with_context
from lit_rlhf.modules import DistillationModule
from lit_rlhf.types import Rollout

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TINY = "tiny-random-llama"
RECIPE = Path(__file__).resolve().parents[2] / "configs" / "quickstart" / "distill.yaml"


@pytest.fixture(scope="module")
def sharp_teacher(tmp_path_factory) -> str:
    """The tiny model with its output layer scaled by 8 (a sharper distribution), saved as a directory."""
    path = tmp_path_factory.mktemp("teacher")
    tok = load_tokenizer(TINY)
    model = load_causal_lm(TINY, tok)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_with_context_inserts_the_context_before_each_prompt_still_left_padded():
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 4]])
    mask = ids != 0
    out, out_mask = with_context(ids, mask, [1, 2], pad_token_id=0)
    assert out.tolist() == [[0, 0, 1, 2, 5, 6], [1, 2, 7, 8, 9, 4]]
    assert out_mask.tolist() == [[False] * 2 + [True] * 4, [True] * 6]
    assert with_context(ids, mask, [], 0)[0] is ids


def test_teacher_is_frozen_and_out_of_the_checkpoint(sharp_teacher):
    module = DistillationModule(model=TINY, teacher=sharp_teacher)
    teacher = module.teacher_model
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    module.train()
    assert not module.teacher_model.training  # stays in eval mode (D7)
    checkpoint = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(checkpoint)
    assert not any(k.startswith("teacher_model.") for k in checkpoint["state_dict"])
    assert any(k.startswith("policy.") for k in checkpoint["state_dict"])
    # and it is what the directory holds: sharper than the student
    assert torch.equal(teacher.lm_head.weight, module.policy.lm_head.weight * 8)


def test_a_teacher_with_another_tokenizer_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"teacher 'tiny-random-smollm2' does not share the student's tokenizer "
                                         r"\('tiny-random-llama'\): vocabularies of"):
        DistillationModule(model=TINY, teacher="tiny-random-smollm2")


def test_tokenizer_differences_catch_a_moved_id():
    student = load_tokenizer(TINY)
    assert tokenizer_differences(student, load_tokenizer(TINY)) == []
    other = load_tokenizer(TINY)
    other.add_tokens(["<|extra|>"])
    assert any("vocabularies" in d for d in tokenizer_differences(student, other))


@pytest.mark.parametrize("kwargs, message", [
    (dict(teacher="base"), "without teacher_context"),
    (dict(teacher="base", teacher_context="x", lmbda=0.5), "only lmbda 1"),
    (dict(teacher="base", teacher_context="x", teacher_top_k=4), "teacher_top_k"),
    (dict(teacher="base", teacher_context="x", reward_weight=1.0, num_generations=1), "num_generations >= 2"),
    (dict(teacher="base", teacher_context="x", loss="gkd", gamma=0.5), "gamma"),
    (dict(teacher="base", teacher_context="x", reward_weight=1.0, num_generations=2), "no reward source is set"),
])
def test_settings_that_cannot_work_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DistillationModule(model=TINY, **kwargs)


def test_the_privileged_context_reaches_the_teacher_only():
    """teacher base + context: its log-probs are the starting model's with the context before the prompt."""
    module = DistillationModule(model=TINY, teacher="base", teacher_context="be brief", num_generations=2)
    tok = module.tokenizer
    prompt = tok("why is the sky blue?", add_special_tokens=False)["input_ids"]
    context = tok("be brief", add_special_tokens=False)["input_ids"]
    response = tok(" abc", add_special_tokens=False)["input_ids"]
    n, r = 2, len(response)
    rollout = Rollout(torch.tensor([prompt] * n), torch.ones(n, len(prompt), dtype=torch.bool),
                      torch.tensor([response] * n), torch.ones(n, r, dtype=torch.bool), torch.zeros(n, dtype=torch.bool),
                      None)
    got = module.teacher_token_logps(rollout, repeats=2)
    full = torch.tensor([context + prompt + response])
    with torch.no_grad():
        logits = module.policy(full).logits[0, -r - 1:-1].log_softmax(-1)
    expected = logits.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)
    torch.testing.assert_close(got[0], expected, rtol=1e-5, atol=1e-5)
    student = module.response_token_logps(module.policy, rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids,
                                           rollout.response_attention_mask)
    assert not torch.allclose(student[0], expected)  # the student's prompt has no context


def test_pure_distillation_needs_no_reward_source_and_scores_zero():
    """`reward_optional`: no reward source, no stand-in function; every score is 0 (a method that
    needs a reward still refuses to start without one)."""
    from lit_rlhf.modules import GRPOModule

    module = DistillationModule(model=TINY, teacher="base", teacher_context="x", num_generations=2, max_new_tokens=4)
    assert module.reward_fns == [] and module.reward_model_name is None
    rows = [{"_prompt_ids": module.tokenizer(p, add_special_tokens=False)["input_ids"], "prompt": p} for p in ("hi", "a b")]
    rollout, per_source, _ = module.make_rollout(PromptCollator(module.tokenizer.pad_token_id)(rows), repeats=2)
    assert per_source == {} and torch.equal(rollout.scores, torch.zeros(rollout.num_rows))
    with pytest.raises(ValueError, match="no reward source"):
        GRPOModule(model=TINY)


def test_lora_teacher_base_is_the_frozen_base_without_a_copy():
    module = DistillationModule(model=TINY, teacher="base", teacher_context="be brief", lora={"r": 4, "alpha": 8})
    assert isinstance(module.teacher_model, adapters.AdapterView) and module.teacher_model.adapter is None
    assert "teacher_model" not in dict(module.named_children())


def test_quickstart_recipe_fits_through_the_cli(tmp_path):
    """One rollout of each loss from the quickstart recipe, tiny overrides; no teacher in last.ckpt."""
    for loss in ("reverse_kl_pg", "gkd"):
        out = tmp_path / loss
        cli = main(["fit", "--config", str(RECIPE), f"--model.init_args.model={TINY}", f"--model.init_args.loss={loss}",
                    "--model.init_args.max_new_tokens=4", "--model.init_args.total_episodes=null",
                    f"--model.init_args.export_dir={out / 'export'}", "--data.init_args.batch_size=1",
                    "--data.init_args.eval_batch_size=1", "--data.init_args.max_prompt_length=512",
                    "--trainer.max_steps=1", "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0",
                    "--trainer.val_check_interval=1", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
                    f"--trainer.default_root_dir={out}",  # where the CLI saves config.yaml (not the working directory)
                    f"--trainer.callbacks.init_args.dirpath={out / 'checkpoints'}"])
        metrics = cli.trainer.callback_metrics
        assert cli.trainer.global_step == 1 and torch.isfinite(metrics["train/loss/total"])
        assert "val/distill/reverse_kl" in metrics and "train/distill/reverse_kl" in metrics
        state = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
        assert not any(k.startswith("teacher_model.") for k in state) and any(k.startswith("policy.") for k in state)
        assert (out / "export" / "config.json").is_file() and (out / "config.yaml").is_file()
