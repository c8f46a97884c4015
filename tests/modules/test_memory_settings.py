"""`memory:` groups the settings that trade compute for memory (`lit_rlhf.training.Memory`);
each is the module's attribute of the same name, a former top-level key names its new place
(from Python and from the command line), an unknown keyword is Python's usual error."""

from __future__ import annotations

import pytest

from lit_rlhf.cli import main
from lit_rlhf.cli_errors import OptionError
from lit_rlhf.modules import GRPOModule, RewardModule, SFTModule
from lit_rlhf.rewards import CharacterFractionReward
from lit_rlhf.training.memory import FIELDS, Memory
from lit_rlhf.training.moved import moved_options

TINY = dict(model="tiny-random-llama")


def test_each_memory_setting_is_the_modules_attribute():
    memory = Memory(gradient_checkpointing=True, logprob_chunk_size=7, shared_prompt=False,
                    frozen_placement="whole", release_host_memory="phases")
    module = SFTModule(**TINY, memory=memory)
    assert {name: getattr(module, name) for name in FIELDS} == memory.settings()
    assert module.policy.is_gradient_checkpointing
    default = SFTModule(**TINY)
    assert {name: getattr(default, name) for name in FIELDS} == Memory().settings()
    assert not default.policy.is_gradient_checkpointing
    assert repr(memory) == ("Memory(gradient_checkpointing=True, logprob_chunk_size=7, shared_prompt=False, "
                            "frozen_placement='whole', release_host_memory='phases')")


@pytest.mark.parametrize("setting, message", [
    (dict(logprob_chunk_size=0), "memory.logprob_chunk_size must be > 0"),
    (dict(frozen_placement="sharded"), "memory.frozen_placement must be 'partitioned' or 'whole'"),
    (dict(release_host_memory="always"), "memory.release_host_memory must be null, 'phases' or 'layers'"),
])
def test_impossible_values_are_refused(setting, message):
    with pytest.raises(ValueError, match=message):
        Memory(**setting)


def test_a_reward_model_refuses_the_policy_only_settings():
    assert RewardModule(**TINY, memory=Memory(gradient_checkpointing=True)).gradient_checkpointing
    with pytest.raises(ValueError, match="policy's settings"):
        RewardModule(**TINY, memory=Memory(frozen_placement="whole"))


def test_a_former_top_level_key_names_its_new_place_from_python():
    with pytest.raises(TypeError, match=r"^SFTModule: `gradient_checkpointing` moved: use memory: \{gradient_checkpointing"):
        SFTModule(**TINY, gradient_checkpointing=True)
    with pytest.raises(TypeError, match=r"^GRPOModule: `release_host_memory` moved: use memory"):
        GRPOModule(**TINY, reward_fns=[CharacterFractionReward()], release_host_memory="phases")
    with pytest.raises(TypeError, match=r"^RewardModule: `shared_prompt` moved: use memory"):
        RewardModule(**TINY, shared_prompt=False)
    with pytest.raises(TypeError, match=r"SFTModule.__init__\(\) got an unexpected keyword argument 'learnig_rate'"):
        SFTModule(**TINY, learnig_rate=1e-3)
    # one list per class, inherited: a variant's, the online wing's and every module's
    assert {"importance_sampling", "max_staleness", "gradient_checkpointing"} <= set(moved_options(GRPOModule))
    assert "max_staleness" not in moved_options(SFTModule)


def test_a_former_top_level_key_names_its_new_place_from_the_cli(tmp_path):
    args = ["fit", "--model=lit_rlhf.modules.SFTModule", "--model.init_args.model=tiny-random-llama",
            "--data=lit_rlhf.data.TLDRSFTDataModule", "--data.init_args.path=bundled:tldr_sft",
            "--trainer.max_steps=1", "--trainer.default_root_dir", str(tmp_path)]
    with pytest.raises(OptionError, match=r"^model.init_args.optimizer_in_backward \(command line\) moved: use memory: "
                                          r"\{optimizer_in_backward: ...\}"):
        main([*args, "--model.init_args.optimizer_in_backward=true"])
