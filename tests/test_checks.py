"""Start-up checks: each bad configuration fails in setup('fit'), before any training step, with a
message naming the setting at fault."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from callbacks import JudgeEvalCallback, RewardNormalizationCallback
from lit_rlhf.training.memory import Memory
from lit_rlhf.checks import ConfigError
from lit_rlhf.data import (
    TLDRPreferenceDataModule,
    TLDRPromptDataModule,
    TLDRSFTDataModule,
    UltraFeedbackPreferenceDataModule,
    UltraFeedbackSingleDataModule,
)
from lit_rlhf.modules import DPOModule, DROVModule, GRPOModule, KTOModule, PPOModule, RewardModule, SFTModule
from lit_rlhf.modules.online import OnlineModule
from lit_rlhf.rewards import CharacterFractionReward

TINY = "tiny-random-llama"
TLDR = dict(max_prompt_length=96, max_completion_length=256, limit=4, batch_size=2, val_split=None, test_split=None)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class NoStep(Callback):
    def on_train_batch_start(self, *args):
        raise AssertionError("a training step started: the check came too late")


def fit(module, dm, tmp_path, callbacks=(), **trainer_kwargs):
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path, callbacks=[NoStep(), *callbacks],
                        **{"limit_val_batches": 0, "enable_checkpointing": False, **trainer_kwargs})
    trainer.fit(module, datamodule=dm)


def tldr_sft(**kw):
    return TLDRSFTDataModule("bundled:tldr_sft", TINY, **{**TLDR, **kw})


def tldr_prompts(**kw):
    return TLDRPromptDataModule("bundled:tldr_sft", TINY, **{**dict(max_prompt_length=96, limit=4, batch_size=3,
                                                                     val_split=None, test_split=None), **kw})


def test_batch_type_the_module_cannot_consume(tmp_path):
    with pytest.raises(ConfigError, match=r"DPOModule trains on PreferenceBatch, but TLDRPromptDataModule yields "
                                          r"PromptBatch \(train split\).*TLDRPreferenceDataModule"):
        fit(DPOModule(model=TINY), tldr_prompts(), tmp_path)
    with pytest.raises(ConfigError, match="GRPOModule trains on PromptBatch, but TLDRSFTDataModule yields SFTBatch"):
        fit(GRPOModule(model=TINY, reward_fns=[CharacterFractionReward()], max_new_tokens=2), tldr_sft(), tmp_path)


def test_grpo_rollout_not_divisible_into_minibatches(tmp_path):
    module = GRPOModule(model=TINY, reward_fns=[CharacterFractionReward()], num_generations=2, num_minibatches=4,
                        max_new_tokens=2)
    with pytest.raises(ConfigError, match=r"batch_size \(3\) x num_generations \(2\) = 6 rows, which do not split "
                                          r"into num_minibatches=4 equal minibatches.*num_minibatches=3"):
        fit(module, tldr_prompts(batch_size=3), tmp_path)


def test_ppo_without_a_reward_source():
    with pytest.raises(ValueError, match="no reward source: set reward_model and/or reward_fns"):
        PPOModule(model=TINY)


def test_prompt_plus_response_over_the_context(tmp_path):
    module = PPOModule(model=TINY, reward_fns=[CharacterFractionReward()], max_new_tokens=2000)
    with pytest.raises(ConfigError, match=r"the longest train prompt \(\d+ tokens, max_prompt_length=96\) \+ "
                                          r"max_new_tokens \(2000\) = \d+ tokens exceeds the context of policy "
                                          r"\(max_position_embeddings=2048\)"):
        fit(module, tldr_prompts(), tmp_path)
    sft = SFTModule(model=TINY)
    sft.policy.config.max_position_embeddings = 64  # a short-context model
    with pytest.raises(ConfigError, match=r"\+ the longest completion \(\d+\) = \d+ tokens exceeds the context of "
                                          r"policy \(max_position_embeddings=64\).*max_completion_length"):
        fit(sft, tldr_sft(), tmp_path)


def test_chat_data_with_a_tokenizer_without_chat_template(tmp_path, tiny_tokenizer):
    import copy

    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = None
    dm = UltraFeedbackPreferenceDataModule("bundled:ultrafeedback_binarized", tokenizer, limit=2, val_split=None)
    with pytest.raises(ValueError, match="chat template"):
        fit(DPOModule(model=TINY), dm, tmp_path)


def test_datamodule_tokenizer_differs_from_the_module(tmp_path):
    module = SFTModule(model=TINY)
    module.tokenizer = _other_tokenizer(module.tokenizer)
    with pytest.raises(ConfigError, match="the DataModule tokenises with .* they differ in pad_token_id"):
        fit(module, tldr_sft(), tmp_path)


def _other_tokenizer(tokenizer):
    import copy

    other = copy.deepcopy(tokenizer)
    other.pad_token_id = other.pad_token_id - 1 if other.pad_token_id > 0 else 1
    return other


def test_reference_sharing_weights_with_the_policy(tmp_path):
    module = DPOModule(model=TINY)
    # a reference built on the policy's own storage (e.g. a view of its weights): it would move with training
    shared = module.policy.get_input_embeddings().weight.data
    module.ref_model.get_input_embeddings().weight = torch.nn.Parameter(shared, requires_grad=False)
    with pytest.raises(ConfigError, match=r"the frozen ref_model shares \d+ parameter tensor\(s\) with the trained "
                                          r"weights.*separate copy"):
        fit(module, TLDRPreferenceDataModule("bundled:tldr_comparisons", TINY, **TLDR), tmp_path)


def test_precomputed_reference_overwritten_by_the_export(tmp_path):
    from lit_rlhf.models import load_causal_lm, load_tokenizer

    start = tmp_path / "sft"
    tok = load_tokenizer(TINY)
    load_causal_lm(TINY, tok).save_pretrained(start)
    tok.save_pretrained(start)
    module = DPOModule(model=str(start), precompute_ref_logps=True, export_dir=str(start))
    with pytest.raises(ConfigError, match=r"precompute_ref_logps=true rebuilds the reference table from .*sft.* "
                                          r"export_dir=.*share the policy's weights"):
        fit(module, TLDRPreferenceDataModule("bundled:tldr_comparisons", str(start), **TLDR), tmp_path)


def test_batch_content_the_method_needs(tmp_path):
    uf = dict(path="bundled:ultrafeedback", tokenizer=TINY, limit=2, batch_size=3, max_completion_length=512)
    with pytest.raises(ConfigError, match="DROVModule needs scalar rewards, but UltraFeedbackSingleDataModule has "
                                          "with_rewards=false"):
        fit(DROVModule(model=TINY), UltraFeedbackSingleDataModule(with_rewards=False, label_mode="threshold", **uf),
            tmp_path)
    with pytest.raises(ConfigError, match="labels_from='labels' but UltraFeedbackSingleDataModule has no label_mode"):
        fit(KTOModule(model=TINY), UltraFeedbackSingleDataModule(**uf), tmp_path)
    with pytest.raises(ConfigError, match="use_margin=true but TLDRPreferenceDataModule has no margin_from"):
        fit(RewardModule(model=TINY, use_margin=True), TLDRPreferenceDataModule("bundled:tldr_comparisons", TINY,
                                                                                **TLDR), tmp_path)


def test_callbacks_that_need_a_split(tmp_path):
    with pytest.raises(ConfigError, match=r"ModelCheckpoint monitors 'val/loss' but there is no validation "
                                          r"\(TLDRSFTDataModule has val_split=null\)"):
        fit(SFTModule(model=TINY), tldr_sft(), tmp_path, callbacks=[ModelCheckpoint(monitor="val/loss")],
            enable_checkpointing=True, limit_val_batches=1.0)
    from lit_rlhf.judges.base import PairwiseJudge

    class NeverCalled(PairwiseJudge):
        def judge(self, prompts, completions_a, completions_b):
            raise AssertionError("not reached")

    judge = JudgeEvalCallback(NeverCalled(), split="val")
    with pytest.raises(ConfigError, match="JudgeEvalCallback reads the 'val' split of the trainer's DataModule, but "
                                          "TLDRSFTDataModule has val_split=null"):
        fit(SFTModule(model=TINY), tldr_sft(), tmp_path, callbacks=[judge])
    with pytest.raises(ConfigError, match="RewardNormalizationCallback needs reference responses .* "
                                          "TLDRPreferenceDataModule has none"):
        fit(RewardModule(model=TINY), TLDRPreferenceDataModule("bundled:tldr_comparisons", TINY, **TLDR), tmp_path,
            callbacks=[RewardNormalizationCallback()])


class BestOfTwo(OnlineModule):
    """Fine-tunes on the best of each prompt's 2 samples: its update trains on one row per prompt."""

    @property
    def repeats(self) -> int:
        return 2

    def __init__(self, num_minibatches: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.num_minibatches = num_minibatches

    def updates_per_rollout(self) -> int:
        return self.num_minibatches

    def update_rows(self, prompts: int) -> int:
        return prompts  # the best response of each prompt

    def update(self, rollout):
        best = rollout.scores.view(-1, 2).argmax(dim=1) + torch.arange(0, rollout.scores.numel(), 2)  # (B,)

        def loss_fn(rows):
            picked = best[rows]
            logps = self.response_token_logps(self.policy, rollout.prompt_ids[picked], rollout.prompt_mask[picked],
                                              rollout.response_ids[picked], rollout.response_attention_mask[picked])
            loss = -(logps * rollout.response_attention_mask[picked]).sum(dim=1).mean()
            return loss, {"policy/loss": loss.detach()}

        return rollout, self.run_updates(len(best), 1, self.num_minibatches, loss_fn)


def test_an_online_modules_update_split_is_checked_at_start_up(tmp_path):
    """3 prompts x 2 samples = 6 sampled rows split in 2, but the update trains on the 3 best: the
    module's `update_rows` tells the check, which refuses the split before the first step."""
    module = BestOfTwo(model=TINY, reward_fns=[CharacterFractionReward()], num_minibatches=2, max_new_tokens=2)
    with pytest.raises(ConfigError, match=r"\(1 problem\(s\)\)") as err:
        fit(module, tldr_prompts(batch_size=3), tmp_path)
    (problem,) = [line for line in str(err.value).splitlines() if line.startswith("  - ")]  # one line
    assert problem == ("  - BestOfTwo updates on 3 rows of each rollout (batch_size (3) x num_generations (2) sampled), "
                       "which do not split into num_minibatches=2 equal minibatches: make 3 divisible by "
                       "num_minibatches (e.g. num_minibatches=1)")


def test_group_reward_normalisation_needs_several_samples_per_prompt(tmp_path):
    module = PPOModule(model=TINY, reward_fns=[CharacterFractionReward()], reward_normalization="group", max_new_tokens=2)
    with pytest.raises(ConfigError, match=r"reward_normalization 'group' z-scores a prompt's samples, and PPOModule "
                                          r"samples 1 per prompt: use 'batch' or 'none'"):
        fit(module, tldr_prompts(), tmp_path)


def test_a_pair_loss_needs_micro_batches_of_whole_pairs(tmp_path):
    from lit_rlhf.modules import OnlineDPOModule

    module = OnlineDPOModule(model=TINY, reward_fns=[CharacterFractionReward()], micro_batch_size=3, max_new_tokens=2)
    with pytest.raises(ConfigError, match=r"OnlineDPOModule's loss reads whole groups of 2 rows: micro_batch_size "
                                          r"\(3\) must be a multiple of 2"):
        fit(module, tldr_prompts(batch_size=2), tmp_path)


def test_every_problem_is_listed_at_once(tmp_path):
    module = GRPOModule(model=TINY, reward_fns=[CharacterFractionReward()], num_generations=2, num_minibatches=4,
                        max_new_tokens=4000)
    with pytest.raises(ConfigError, match=r"\(2 problem\(s\)\)") as err:
        fit(module, tldr_prompts(batch_size=3), tmp_path)
    assert "max_new_tokens (4000)" in str(err.value) and "num_minibatches=4" in str(err.value)


class SFTWithOwnCheck(SFTModule):
    def check_config(self, trainer, datamodule):
        return super().check_config(trainer, datamodule) + [f"own check saw {type(datamodule).__name__}"]


def test_a_modules_own_check_config_is_listed_with_the_others(tmp_path):
    """`check_config(trainer, datamodule)` is the module's hook (`lit_rlhf.checks` never imports
    `lit_rlhf.modules`): a subclass's problems and the base's (optimizer_in_backward) come together."""
    module = SFTWithOwnCheck(model=TINY, memory=Memory(optimizer_in_backward=True))
    with pytest.raises(ConfigError, match=r"\(2 problem\(s\)\)") as err:
        fit(module, tldr_sft(), tmp_path, gradient_clip_val=1.0)
    assert "own check saw TLDRSFTDataModule" in str(err.value)
    assert "optimizer_in_backward" in str(err.value) and "gradient_clip_val" in str(err.value)


def test_a_good_configuration_passes(tmp_path):
    fit_ok = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                       enable_model_summary=False, default_root_dir=tmp_path, limit_val_batches=0,
                       enable_checkpointing=False)
    fit_ok.fit(SFTModule(model=TINY), datamodule=tldr_sft())
    assert fit_ok.global_step == 1
