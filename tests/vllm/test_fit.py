"""GRPO and PPO on the vLLM backend: they learn as the hf backend does on the same reward, the
sampler's log-probs agree with the trainer's, TIS runs, and resume is exact."""

from __future__ import annotations

import csv
import math

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from lit_rlhf.data.collate import PromptCollator
from lit_rlhf.modules import GRPOModule, PPOModule, ReMaxModule
from lit_rlhf.online import VLLMSampler
from lit_rlhf.rewards import CharacterFractionReward
from tests.resume.test_resume import Recorder, StopAfter
from tests.vllm.conftest import attach

PROMPTS = ["hello there", "what is", "tell me a story", "x", "abc", "The cat", "Q: 2+2?", "once"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def prompt_loader(tokenizer, batch_size=4):
    rows = [{"_prompt_ids": tokenizer(p, add_special_tokens=False)["input_ids"], "prompt": p} for p in PROMPTS]
    return DataLoader(rows, batch_size=batch_size, shuffle=True, collate_fn=PromptCollator(tokenizer.pad_token_id))


def fit(module, root, callbacks=(), ckpt_path=None, **trainer_args):
    trainer = L.Trainer(
        max_epochs=-1, accelerator="cpu", logger=L.pytorch.loggers.CSVLogger(root), enable_checkpointing=bool(
            [c for c in callbacks if isinstance(c, ModelCheckpoint)]), enable_progress_bar=False,
        enable_model_summary=False, log_every_n_steps=1, callbacks=list(callbacks), **trainer_args,
    )
    trainer.fit(module, prompt_loader(module.tokenizer), ckpt_path=ckpt_path)
    path = max(root.rglob("metrics.csv"), key=lambda p: p.stat().st_mtime)  # this fit's (a resumed run adds one)
    rows = [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(path.open())]
    return trainer, [r for r in rows if "train/objective/scores" in r]


def grpo(model_dir, backend, **extra):
    L.seed_everything(0)
    args = dict(reward_fns=[CharacterFractionReward(LETTERS)], num_generations=4, max_new_tokens=8, lr=3e-3,
                lr_scheduler="constant", kl_coef=0.01, num_iterations=2, total_episodes=16 * 20,
                log_completions_every_n_steps=0)
    return GRPOModule(model=model_dir, rollout=source(backend, extra), **{**args, **extra})


def source(backend, extra):
    """The rollout source of a backend name: `hf` (the default HFSampler) or `vllm` (`tis_cap` from `extra`)."""
    tis_cap = extra.pop("tis_cap", None)
    return VLLMSampler(tis_cap=tis_cap) if backend == "vllm" else None


def ppo(model_dir, backend, **extra):
    L.seed_everything(0)
    return PPOModule(
        model=model_dir, reward_fns=[CharacterFractionReward(LETTERS)], max_new_tokens=8, temperature=1.0,
        lr=3e-3, lr_scheduler="constant", kl_coef=0.01, ppo_epochs=2, num_minibatches=2, micro_batch_size=4,
        total_episodes=8 * 30, rollout=source(backend, extra), log_completions_every_n_steps=0, **extra,
    )


def gain(metrics):
    scores = [m["train/objective/scores"] for m in metrics]
    return sum(scores[-5:]) / 5 - sum(scores[:5]) / 5


@pytest.mark.parametrize("method", ["grpo", "ppo"])
def test_learns_like_hf_and_sampler_logps_agree(method, vllm_model_dir, engine, tmp_path):
    build = grpo if method == "grpo" else ppo
    _, hf = fit(build(vllm_model_dir, "hf"), tmp_path / "hf")
    module = attach(build(vllm_model_dir, "vllm", tis_cap=2.0), engine)
    _, vl = fit(module, tmp_path / "vllm")
    print(f"{method}: score gain hf {gain(hf):.3f}, vllm {gain(vl):.3f}")
    assert len(vl) == len(hf)
    assert gain(hf) > 0.1 and gain(vl) > 0.1, (gain(hf), gain(vl))
    # the engine follows the policy: sampler and trainer agree on every rollout (fp32, CPU)
    diffs = [m["train/rollout/sampler_logprob_diff_max"] for m in vl]
    assert all(math.isfinite(d) and d < 1e-3 for d in diffs), max(diffs)
    assert all(m["train/rollout/sampler_logprob_diff"] <= m["train/rollout/sampler_logprob_diff_max"] for m in vl)
    assert "train/rollout/sampler_logprob_diff" not in hf[0]


def test_resume_is_exact_on_vllm(vllm_model_dir, engine, tmp_path):
    """As tests/resume (the `grpo` case): a straight fit of 4 rollouts, and one stopped after 2
    (mid-epoch) then resumed from last.ckpt, log the same metrics and end with the same weights."""
    from lit_rlhf.data import TLDRPromptDataModule

    def run(root, stop_after=None, ckpt_path=None):
        module = attach(grpo(vllm_model_dir, "vllm", total_episodes=None, num_generations=2, kl_coef=0.04,
                             num_iterations=1, max_new_tokens=4, lr=1e-2), engine)
        dm = TLDRPromptDataModule(tokenizer=vllm_model_dir, path="bundled:tldr_sft", max_prompt_length=96, limit=6,
                                  batch_size=2, val_split=None, test_split=None)
        recorder = Recorder()
        callbacks = [recorder, ModelCheckpoint(dirpath=root / "checkpoints", save_last=True, every_n_train_steps=1,
                                               save_top_k=0)]
        if stop_after:
            callbacks.append(StopAfter(stop_after))
        trainer = L.Trainer(max_steps=4, accelerator="cpu", precision=32, logger=False, callbacks=callbacks,
                            default_root_dir=root, enable_progress_bar=False, enable_model_summary=False,
                            limit_val_batches=0, deterministic=True, log_every_n_steps=1)
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
        return module, recorder

    straight, straight_rec = run(tmp_path / "straight")
    run(tmp_path / "split", stop_after=2)
    resumed, resumed_rec = run(tmp_path / "split", ckpt_path=str(tmp_path / "split" / "checkpoints" / "last.ckpt"))
    for step in (3, 4):
        assert resumed_rec.metrics[step] and resumed_rec.metrics[step] == straight_rec.metrics[step], step
        assert "train/rollout/sampler_logprob_diff" in resumed_rec.metrics[step]
    a, b = straight.state_dict(), resumed.state_dict()
    assert not [k for k in a if not torch.equal(a[k], b[k])]
    initial = grpo(vllm_model_dir, "hf")
    assert any(not torch.equal(v, initial.state_dict()[k]) for k, v in a.items() if v.is_floating_point())


def test_bad_backend_configuration_is_named(vllm_model_dir):
    with pytest.raises(TypeError, match="`generation_backend` moved: use rollout: "):
        GRPOModule(model=vllm_model_dir, reward_fns=[CharacterFractionReward(LETTERS)], generation_backend="vllm")
    with pytest.raises(ValueError, match="has no rollout correction .correction, tis_cap."):
        ReMaxModule(model=vllm_model_dir, reward_fns=[CharacterFractionReward(LETTERS)], rollout=VLLMSampler(tis_cap=2.0))


def test_judge_callback_samples_the_policy_with_the_engine(vllm_model_dir, engine, tmp_path):
    """Validation of a GRPO module on vllm: its rollouts and the judge callback's completions come
    from the engine, and the judged completions are the policy's greedy ones (as hf decodes them)."""
    from callbacks import JudgeEvalCallback
    from lit_rlhf.generation import SamplingConfig
    from lit_rlhf.evaluation import generate_completions, prompts_from_texts
    from lit_rlhf.judges import Judgement, PairwiseJudge

    class LongerWins(PairwiseJudge):
        def judge(self, prompts, completions_a, completions_b):
            return [Judgement("a" if len(a) > len(b) else "b" if len(b) > len(a) else "tie") for a, b in
                    zip(completions_a, completions_b)]

    module = attach(grpo(vllm_model_dir, "vllm"), engine)
    calls = []
    generate = engine.generate
    engine.generate = lambda *a, **k: calls.append(a[0].shape[0]) or generate(*a, **k)
    greedy = SamplingConfig(max_new_tokens=6, temperature=1.0, do_sample=False)
    prompts = ["Q: say something.\nA:", "hello", "The cat"]
    callback = JudgeEvalCallback(LongerWins(), baseline="reference", prompts=prompts, references=["a", "bb", "x"],
                                 sampling=greedy, batch_size=2)
    trainer = L.Trainer(accelerator="cpu", logger=False, callbacks=[callback], enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    try:
        trainer.validate(module, dataloaders=prompt_loader(module.tokenizer))
    finally:
        del engine.generate  # back to the class method
    assert calls[:2] == [4, 4] and calls[2:] == [2, 1]  # 2 validation batches, then the judge's 3 prompts
    ids = prompts_from_texts(module.tokenizer, prompts).prompt_ids
    expected = generate_completions(module.policy, module.tokenizer, ids, greedy, batch_size=2)
    assert [r["policy"] for r in callback.last_evaluation.rows] == expected
