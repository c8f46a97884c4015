"""What a new online method can no longer get wrong without being told: a narrowed constructor
keeps the DataModule's tokenizer; a pair loss gets whole pairs in every pass; a method that did
not opt in refuses an environment (tests/envs/test_env_fit.py); an online setting given where it
no longer lives names its new place."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lit_rlhf.cli import main
from lit_rlhf.online import update


def test_a_narrowed_subclass_fits_through_the_cli_with_the_modules_tokenizer(tmp_path):
    """`NarrowedGRPO` exposes neither `model` nor `tokenizer`; the DataModule's tokenizer follows
    the built module's (the link used to read `model.init_args.model`, which such a class lacks,
    and the fit stopped with 'TLDRPromptDataModule needs a tokenizer')."""
    torch.set_num_threads(1)
    cli = main([
        "fit", "--model=tests.modules.pinned.NarrowedGRPO", "--model.init_args.letters=abc",
        "--data=lit_rlhf.data.TLDRPromptDataModule", "--data.init_args.path=bundled:tldr_sft",
        "--data.init_args.limit=4", "--data.init_args.batch_size=2", "--data.init_args.max_prompt_length=256",
        "--data.init_args.val_split=null", "--data.init_args.test_split=null",
        "--trainer.max_steps=1", "--trainer.accelerator=cpu", "--trainer.logger=false", "--trainer.callbacks=[]",
        "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
        "--trainer.default_root_dir", str(tmp_path),
    ])
    assert cli.trainer.global_step == 1 and cli.datamodule.hparams["tokenizer"] == "tiny-random-llama"


def test_minibatches_hold_whole_groups_in_every_pass():
    torch.manual_seed(0)
    for shuffle in (False, True):
        batches = list(update.minibatches(12, 2, group_size=3, shuffle=shuffle))
        assert [len(b) for b in batches] == [6, 6] and sorted(torch.cat(batches).tolist()) == list(range(12))
        for rows in batches:
            groups = rows.view(-1, 3)
            assert (groups // 3 == groups[:, :1] // 3).all() and (groups % 3 == torch.arange(3)).all()
    with pytest.raises(ValueError, match="do not split into num_minibatches=4"):
        list(update.minibatches(12, 4, group_size=2))


def test_a_pair_loss_gets_whole_pairs_in_each_of_three_passes(tmp_path):
    """REBEL (examples/rebel.py) regresses on a pair's difference: over 3 passes of 2 minibatches
    every micro-batch it sees is whole pairs in order (rows 2i, 2i+1). Rows shuffled one by one
    after the first pass (as the update loop once did) mix prompts: this test fails then."""
    from examples.rebel import REBELModule
    from lit_rlhf.rewards import CharacterFractionReward
    from tests.learning.tasks import make_prompts, prompt_loader

    seen: list[torch.Tensor] = []

    class Recording(REBELModule):
        def run_updates(self, n_rows, epochs, num_minibatches, loss_fn, row_weights=None, group_size=None):
            def recorded(rows):
                seen.append(rows.clone())
                return loss_fn(rows)
            return super().run_updates(n_rows, epochs, num_minibatches, recorded, row_weights, group_size)

    torch.set_num_threads(1)
    L.seed_everything(0)
    module = Recording(model="tiny-random-llama", reward_fns=[CharacterFractionReward("abc")], max_new_tokens=4,
                       num_iterations=3, num_minibatches=2, micro_batch_size=2, lr=1e-3,
                       log_completions_every_n_steps=0)
    trainer = L.Trainer(max_steps=6, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, prompt_loader(module.tokenizer, make_prompts(4, 0), 4))
    assert trainer.global_step == 6 and len(seen) == 3 * 2 * 2  # passes x minibatches x micro-batches
    for rows in seen:
        assert len(rows) == 2 and rows[0] % 2 == 0 and rows[1] == rows[0] + 1, rows
    assert any(not torch.equal(a, b) for a, b in zip(seen[:4], seen[4:8]))  # a later pass in another order
    assert module.whole_groups  # an odd micro_batch_size is refused at start-up (tests/test_checks.py)


def test_an_online_setting_given_where_it_used_to_live_names_its_new_place(tmp_path):
    """From the command line (or a YAML) and from Python, one line that says where it went."""
    from lit_rlhf.cli_errors import OptionError
    from lit_rlhf.modules import RLOOModule
    from lit_rlhf.rewards import CharacterFractionReward

    args = ["fit", "--model=lit_rlhf.modules.RLOOModule", "--model.init_args.model=tiny-random-llama",
            "--model.init_args.reward_fns=[{class_path: lit_rlhf.rewards.CharacterFractionReward}]",
            "--data=lit_rlhf.data.TLDRPromptDataModule", "--data.init_args.path=bundled:tldr_sft",
            "--trainer.max_steps=1", "--trainer.default_root_dir", str(tmp_path)]
    for key, place in (("max_staleness=1", "lit_rlhf.online.AsyncRollouts"),
                       ("generation_backend=vllm", "lit_rlhf.online.VLLMSampler")):
        with pytest.raises(OptionError, match=rf"model.init_args.{key.split('=')[0]} \(command line\) moved: use .*{place}.* \(the rollout source\)"):
            main([*args, f"--model.init_args.{key}"])
    with pytest.raises(TypeError, match="^RLOOModule: `environment` moved: use rollout: .*EnvironmentRollouts"):
        RLOOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward()], environment=None)
