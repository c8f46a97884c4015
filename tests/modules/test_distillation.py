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
    (dict(teacher="base", teacher_context="x", lmbda=0.5), "needs loss 'gkd'"),
    (dict(teacher="base", teacher_context="x", loss="gkd", lmbda=0.5, kl_coef=0.1), "kl_coef 0"),
    (dict(teacher="base", teacher_context="x", loss="gkd", lmbda=1.5), r"lmbda must be in \[0, 1\]"),
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


def test_quickstart_recipe_fits_through_the_cli(tmp_path, caplog):
    """One rollout of each loss from the quickstart recipe, tiny overrides; no teacher in last.ckpt;
    the fit's result line gives the validation reverse KL that was logged."""
    for loss in ("reverse_kl_pg", "gkd"):
        caplog.clear()
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
        (step, value), = cli.model.val_reverse_kl  # one validation, after step 1
        assert step == 1 and value == pytest.approx(float(metrics["val/distill/reverse_kl"]), abs=1e-6)
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("distillation result:")]
        assert lines == [f"distillation result: val/distill/reverse_kl {value:.4g} (step 1) -> {value:.4g} (step 1), "
                         "1 validations"]
        state = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
        assert not any(k.startswith("teacher_model.") for k in state) and any(k.startswith("policy.") for k in state)
        assert (out / "export" / "config.json").is_file() and (out / "config.yaml").is_file()


@pytest.mark.parametrize("top_k", [None, 5])
def test_gkd_from_hidden_states_equals_the_dense_path(sharp_teacher, top_k):
    """The module's GKD terms a chunk of tokens at a time (`memory.logprob_chunk_size`, the
    default) and from the full (n, R, V) log-probabilities (`null`): same loss, sampled-token
    log-probs and policy gradients."""
    from lit_rlhf.training import Memory

    results = []
    for chunk in (3, None):
        torch.manual_seed(0)
        module = DistillationModule(model=TINY, teacher=sharp_teacher, loss="gkd", beta=0.5, teacher_top_k=top_k,
                                    num_generations=2, memory=Memory(logprob_chunk_size=chunk))
        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(3, 100, (2, 4), generator=g)
        response = torch.randint(3, 100, (2, 5), generator=g)
        prompt_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
        response_mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
        teacher_ids, teacher_mask = with_context(prompt, prompt_mask, [], module.tokenizer.pad_token_id)
        out, logps, picked = module.gkd_terms((prompt, prompt_mask, response, response_mask), teacher_ids, teacher_mask,
                                              response_mask)
        out.loss.backward()
        grads = [p.grad.clone() for p in module.policy.parameters() if p.grad is not None]
        results.append((out.loss.detach(), torch.where(response_mask, logps.detach(), 0.0),
                        torch.where(response_mask, picked, 0.0), grads, type(out).__name__))
    (loss_c, logps_c, picked_c, grads_c, kind_c), (loss_d, logps_d, picked_d, grads_d, kind_d) = results
    assert (kind_c, kind_d) == ("ChunkedGKDOutput", "GKDLossOutput")  # each path really ran
    torch.testing.assert_close(loss_c, loss_d, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logps_c, logps_d, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(picked_c, picked_d, rtol=1e-5, atol=1e-5)
    assert len(grads_c) == len(grads_d) > 0
    for got, want in zip(grads_c, grads_d):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def prompt_rows(tokenizer, references):
    return PromptCollator(tokenizer.pad_token_id)([
        {"_prompt_ids": tokenizer(p, add_special_tokens=False)["input_ids"], "prompt": p, "reference": r}
        for p, r in zip(("hi there", "a b"), references)])


def test_a_reference_rollout_lays_out_fixed_completions_like_samples():
    from lit_rlhf.online.fixed import reference_rollout

    tok = load_tokenizer(TINY)
    batch = prompt_rows(tok, [" yes", " one two three four five six"])
    width = 8
    rollout = reference_rollout(batch, tok, repeats=2, max_new_tokens=width)
    short = tok(" yes", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    long = tok(" one two three four five six", add_special_tokens=False)["input_ids"][:width]
    assert len(short) < width < len(long) + 1
    assert rollout.response_ids.shape == (4, width) and torch.equal(rollout.prompt_ids[0], rollout.prompt_ids[1])
    for row in (0, 1):  # a prompt's copies are contiguous
        assert rollout.response_ids[row, :len(short)].tolist() == short and rollout.has_eos[row]
        assert rollout.loss_mask[row].tolist() == [True] * len(short) + [False] * (width - len(short))
    for row in (2, 3):  # cut at max_new_tokens: no EOS, every token trained on
        assert rollout.response_ids[row].tolist() == long and not rollout.has_eos[row] and rollout.loss_mask[row].all()
    assert rollout.meta["reference"] == [" yes", " yes"] + [" one two three four five six"] * 2
    with pytest.raises(ValueError, match=r"empty or missing in rows \[1\]"):
        reference_rollout(prompt_rows(tok, [" yes", ""]), tok, 2, 4)


def test_lmbda_mixes_student_samples_and_fixed_completions_by_a_seeded_draw():
    """lmbda 0: every step trains on the references; 0.5: the draw follows the rollout count
    (the same count, the same choice), and both kinds occur."""
    tok = load_tokenizer(TINY)
    batch = prompt_rows(tok, [" yes", " no"])
    never = DistillationModule(model=TINY, teacher="base", teacher_context="x", loss="gkd", lmbda=0.0,
                               num_generations=2, max_new_tokens=4)
    rollout, _, stats = never.collect_rollout(batch)
    assert stats == {"distill/on_policy": torch.tensor(0.0)}
    assert rollout.response_ids[0, 0].item() == tok(" yes", add_special_tokens=False)["input_ids"][0]
    half = DistillationModule(model=TINY, teacher="base", teacher_context="x", loss="gkd", lmbda=0.5,
                              num_generations=2, max_new_tokens=4)
    kinds = []
    for count in range(12):
        half.rollouts = count
        kinds.append(float(half.collect_rollout(batch)[2]["distill/on_policy"]))
    assert set(kinds) == {0.0, 1.0}
    half.rollouts = 5
    assert float(half.collect_rollout(batch)[2]["distill/on_policy"]) == kinds[5]
