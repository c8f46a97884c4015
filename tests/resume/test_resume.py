"""Exact resume for every method: N steps straight == N/2 steps, stop, resume from last.ckpt, N/2 more.

Each case trains the tiny model on bundled data with 3 batches per epoch. The straight run
takes N = 4 batches (crossing into epoch 1, which is reshuffled: D21); the split run stops after
2 batches, in the middle of epoch 0, writes `last.ckpt` (ModelCheckpoint, as `--ckpt_path last`
finds it), and a fresh module, DataModule and Trainer resume from it. The logged training
metrics of batches 3 and 4 and every final weight must be identical: tolerance 0 (bitwise
equal; CPU, float32, one thread). PPO/GRPO sample with the global torch generator and PPO
shuffles its minibatches with it, so this also checks the restored random states; PPO/GRPO
also carry their episode counters, and the KL controller its coefficient.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from callbacks import KLControlCallback
from lit_rlhf.data import (
    TLDRPreferenceDataModule,
    TLDRPromptDataModule,
    TLDRSFTDataModule,
    UltraFeedbackSingleDataModule,
)
from lit_rlhf.modules import (
    DAPOModule,
    DistillationModule,
    DPOModule,
    DROVModule,
    GRPOModule,
    KTOModule,
    OnlineDPOModule,
    ORPOModule,
    PPOModule,
    PPOPtxModule,
    RejectionSamplingModule,
    ReMaxModule,
    RewardModule,
    SFTModule,
)
from lit_rlhf.rewards import CharacterFractionReward

N = 4  # batches (rollouts for PPO/GRPO) of the straight run; the split run stops after N // 2
LETTERS = "abcdefghijklmnopqrstuvwxyz"
TLDR = dict(max_prompt_length=96, max_completion_length=256, limit=6, batch_size=2)  # 3 batches per epoch
UF = dict(path="bundled:ultrafeedback", max_prompt_length=128, max_completion_length=512, limit=2, batch_size=3)
ONLINE = dict(reward_fns=[CharacterFractionReward(LETTERS)], max_new_tokens=4, lr=1e-2, micro_batch_size=None,
              log_completions_every_n_steps=0)
LORA = {"r": 4, "alpha": 8}
PROMPTS = dict(path="bundled:tldr_sft", max_prompt_length=96, limit=6, batch_size=2)  # 3 batches per epoch
PTX_DATA = {"class_path": "lit_rlhf.data.TLDRSFTDataModule",
            "init_args": {"path": "bundled:tldr_sft", "train_split": "validation", "max_prompt_length": 96,
                          "max_completion_length": 256, "limit": 5, "batch_size": 2}}



def mostly_letters(prompts, completions, **columns):
    """1 when most characters are letters, else 0: many groups of 2 get equal rewards."""
    return [float(r > 0.5) for r in CharacterFractionReward(LETTERS)(prompts, completions)]


CASES = {
    # name: (module class, module args, optimizer steps per batch, DataModule class, DataModule args)
    "sft": (SFTModule, dict(lr=1e-3), 1, TLDRSFTDataModule, dict(path="bundled:tldr_sft", **TLDR)),
    "reward": (RewardModule, dict(lr=1e-3), 1, TLDRPreferenceDataModule, dict(path="bundled:tldr_comparisons", **TLDR)),
    "dpo": (DPOModule, dict(lr=1e-3, beta=0.5), 1, TLDRPreferenceDataModule,
            dict(path="bundled:tldr_comparisons", **TLDR)),
    "orpo": (ORPOModule, dict(lr=1e-3, odds_ratio_coef=1.0), 1, TLDRPreferenceDataModule,
             dict(path="bundled:tldr_comparisons", **TLDR)),
    "kto": (KTOModule, dict(lr=1e-3), 1, UltraFeedbackSingleDataModule, dict(label_mode="threshold", **UF)),
    "drov": (DROVModule, dict(lr=1e-3, value_lr=1e-2), 1, UltraFeedbackSingleDataModule, dict(UF)),
    # PPO: 2 PPO epochs per rollout, the second one shuffles its minibatches with the global generator
    "ppo": (PPOModule, dict(ppo_epochs=2, num_minibatches=2, **ONLINE), 4, TLDRPromptDataModule,
            dict(path="bundled:tldr_sft", max_prompt_length=96, limit=6, batch_size=2)),
    "grpo": (GRPOModule, dict(num_generations=2, kl_coef=0.04, **ONLINE), 1, TLDRPromptDataModule,
             dict(path="bundled:tldr_sft", max_prompt_length=96, limit=6, batch_size=2)),
    # DAPO's dynamic sampling draws extra prompts from its refill stream (its counter is checkpointed);
    # GRPO's clip and every completion in the loss, as the dynamic sampling alone is what resumes here
    "dapo_dynamic": (DAPOModule, dict(num_generations=2, kl_coef=0.0, dynamic_sampling=True, max_sampling_rounds=3,
                                      clip_eps_high=0.2, mask_truncated=False,
                                      **{**ONLINE, "reward_fns": [mostly_letters]}), 1, TLDRPromptDataModule,
                     dict(path="bundled:tldr_sft", max_prompt_length=96, limit=6, batch_size=2)),
    # ReMax: the greedy baseline (a per-row extra) decoded in every rollout; KL in the reward
    "remax": (ReMaxModule, dict(num_generations=2, kl_coef=0.05, **ONLINE), 1, TLDRPromptDataModule, dict(PROMPTS)),
    # rejection sampling: no log-probs at rollout time, 2 passes over the kept rows (the second shuffled)
    "rejection_sampling": (RejectionSamplingModule, dict(num_generations=2, num_iterations=2, **ONLINE), 2,
                           TLDRPromptDataModule, dict(PROMPTS)),
    "online_dpo": (OnlineDPOModule, dict(beta=0.1, **ONLINE), 1, TLDRPromptDataModule, dict(PROMPTS)),
    # PPO-ptx: one SFT batch per optimizer step from its own stream (5 rows read 2 at a time, so
    # batches straddle its reshuffled passes); the stream's counter is checkpointed
    "ppo_ptx": (PPOPtxModule, dict(ppo_epochs=2, num_minibatches=2, ptx_coef=1.0, ptx_data=PTX_DATA, **ONLINE), 4,
                TLDRPromptDataModule, dict(PROMPTS)),
    # on-policy distillation from the starting weights given a privileged context (a frozen copy,
    # never checkpointed), the task reward mixed in; GKD over the teacher's top-k with a tail bucket,
    # half its steps on the prompts' fixed references (lmbda 0.5: the draw follows the rollout count)
    "distill": (DistillationModule, dict(teacher="base", teacher_context="Answer in one line:", num_generations=2,
                                         reward_weight=0.5, **ONLINE), 1, TLDRPromptDataModule, dict(PROMPTS)),
    "distill_gkd": (DistillationModule, dict(teacher="base", teacher_context="Answer in one line:", loss="gkd",
                                             beta=0.5, teacher_top_k=8, lmbda=0.5, **ONLINE), 1, TLDRPromptDataModule,
                    dict(PROMPTS)),
    # LoRA: adapters on one frozen base (PPO: policy and value adapters; the reference is the base)
    "dpo_lora": (DPOModule, dict(lr=1e-2, beta=0.5, lora=LORA), 1, TLDRPreferenceDataModule,
                 dict(path="bundled:tldr_comparisons", **TLDR)),
    "orpo_lora": (ORPOModule, dict(lr=1e-2, odds_ratio_coef=1.0, lora=LORA), 1, TLDRPreferenceDataModule,
                  dict(path="bundled:tldr_comparisons", **TLDR)),
    "reward_lora": (RewardModule, dict(lr=1e-2, lora=LORA), 1, TLDRPreferenceDataModule,
                    dict(path="bundled:tldr_comparisons", **TLDR)),
    "ppo_lora": (PPOModule, dict(ppo_epochs=2, num_minibatches=2, lora=LORA, **ONLINE), 4, TLDRPromptDataModule,
                 dict(path="bundled:tldr_sft", max_prompt_length=96, limit=6, batch_size=2)),
}
IGNORED = ("perf/", "time/")  # wall-clock metrics


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class Recorder(Callback):
    """The train metrics logged at each batch, by batch number (1-based, over the whole fit)."""

    def __init__(self):
        self.metrics: dict[int, dict[str, float]] = {}
        self.data_ids: dict[int, list] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        n = trainer.fit_loop.total_batch_idx + 1
        self.metrics[n] = {
            k: float(v) for k, v in trainer.callback_metrics.items()
            if k.startswith("train/") and not any(x in k for x in IGNORED)
        }
        self.data_ids[n] = list(batch.meta.get("index", []))


class StopAfter(Callback):
    """Stop after `batches` batches, as a preempted job would: same config, cut short."""

    def __init__(self, batches: int):
        self.batches = batches

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.fit_loop.total_batch_idx + 1 >= self.batches:
            trainer.should_stop = True


def build(name: str):
    module_cls, module_args, steps_per_batch, dm_cls, dm_args = CASES[name]
    L.seed_everything(0)
    module = module_cls(model="tiny-random-llama", **module_args)
    dm = dm_cls(tokenizer="tiny-random-llama", val_split=None, test_split=None, **dm_args)
    return module, dm, steps_per_batch


def fit(name: str, root, ckpt_path=None, stop_after=None):
    """N batches (the learning-rate schedule is sized for N), or stop after `stop_after` and write
    last.ckpt there."""
    module, dm, steps_per_batch = build(name)
    recorder = Recorder()
    callbacks = []
    if name in ("ppo", "grpo"):
        callbacks.append(KLControlCallback(target=1.0, horizon=10, clip=0.2))  # adaptive: state changes every rollout
    callbacks.append(recorder)  # after the callbacks that log
    if stop_after:
        callbacks.append(StopAfter(stop_after))
    callbacks.append(ModelCheckpoint(dirpath=root / "checkpoints", save_last=True, every_n_train_steps=1, save_top_k=0))
    trainer = L.Trainer(
        max_steps=N * steps_per_batch, accelerator="cpu", precision=32, logger=False, callbacks=callbacks,
        default_root_dir=root, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        deterministic=True, log_every_n_steps=1,  # every step's stats, to compare them
    )
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module, trainer, recorder, dm


@pytest.mark.parametrize("name", list(CASES))
def test_resume_is_exact(name, tmp_path):
    straight, straight_trainer, straight_rec, dm = fit(name, tmp_path / "straight")
    assert len(dm.train_dataloader()) == 3, "each case needs 3 batches per epoch (N/2 mid-epoch, N in epoch 1)"

    _, first_trainer, first_rec, _ = fit(name, tmp_path / "split", stop_after=N // 2)
    last = tmp_path / "split" / "checkpoints" / "last.ckpt"
    assert last.is_file() and first_trainer.global_step == straight_trainer.global_step // 2
    resumed, resumed_trainer, resumed_rec, _ = fit(name, tmp_path / "split", ckpt_path=str(last))

    assert resumed_trainer.global_step == straight_trainer.global_step
    # the same data, in the same order: the rest of epoch 0, then the reshuffled epoch 1
    assert [first_rec.data_ids[i] for i in (1, 2)] == [straight_rec.data_ids[i] for i in (1, 2)]
    assert [resumed_rec.data_ids[i] for i in (3, 4)] == [straight_rec.data_ids[i] for i in (3, 4)]
    assert len(sum((straight_rec.data_ids[i] for i in (1, 2, 3)), [])) == len(dm.dataset("train"))  # epoch 0
    # identical logged metrics (tolerance 0) at the resumed steps
    for step in (3, 4):
        assert resumed_rec.metrics[step], f"nothing logged at batch {step}"
        assert resumed_rec.metrics[step] == straight_rec.metrics[step], f"batch {step} differs after resume"
    # identical final weights, every tensor (policy, value model / head, D15-able reward head...)
    a, b = straight.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"weights differ after resume: {different[:5]}"
    # and training moved them (the comparison is not vacuous)
    initial, _, _ = build(name)
    assert any(not torch.equal(v, initial.state_dict()[k]) for k, v in a.items() if v.is_floating_point())
    if name in ("ppo", "grpo"):
        assert resumed.episodes == straight.episodes == N * 2 * (2 if name == "grpo" else 1)
        kl = [cb for cb in resumed_trainer.callbacks if isinstance(cb, KLControlCallback)][0]
        kl_straight = [cb for cb in straight_trainer.callbacks if isinstance(cb, KLControlCallback)][0]
        assert kl.kl_coef == kl_straight.kl_coef != (0.05 if name == "ppo" else 0.04)
    if name == "ppo_ptx":  # one SFT batch per optimizer step, the stream resumed where it stopped
        assert resumed.ptx_batches == straight.ptx_batches == N * 4
    if name == "dapo_dynamic":  # the refill stream was used, and resumed where it stopped
        assert resumed.refill_batches == straight.refill_batches > 0
        assert resumed.episodes == straight.episodes > N * 2 * 2


def test_without_restored_random_state_online_resume_diverges(tmp_path, monkeypatch):
    """The random states matter: dropping them from the checkpoint breaks GRPO's resume."""
    import lit_rlhf.rng as rng

    _, _, straight_rec, _ = fit("grpo", tmp_path / "straight")
    fit("grpo", tmp_path / "split", stop_after=N // 2)
    monkeypatch.setattr(rng, "pending_state", lambda checkpoint, trainer=None: None)
    _, _, resumed_rec, _ = fit("grpo", tmp_path / "split", ckpt_path=str(tmp_path / "split" / "checkpoints" / "last.ckpt"))
    assert resumed_rec.data_ids[3] == straight_rec.data_ids[3]  # same prompts ...
    assert resumed_rec.metrics[3] != straight_rec.metrics[3]  # ... different samples
