"""Every YAML under configs/ parses through the CLI (`--print_config`), alone or composed."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import yaml

from lit_rlhf.cli import main

with contextlib.suppress(ImportError):  # DeepSpeed logs to stdout on first use: import it before capturing
    import deepspeed  # noqa: F401

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
METHOD_CONFIGS = sorted(p for p in CONFIGS.rglob("*.yaml") if yaml.safe_load(p.read_text()).get("model"))
OVERLAY_CONFIGS = sorted(p for p in CONFIGS.rglob("*.yaml") if p not in METHOD_CONFIGS)


def print_config(*configs: Path) -> dict:
    args = ["fit"]
    for config in configs:
        args += ["--config", str(config)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        main(args + ["--print_config"])
    assert exit_info.value.code in (0, None), out.getvalue()
    return yaml.safe_load(out.getvalue())


def test_there_are_configs():
    assert METHOD_CONFIGS, "no method configs found"


@pytest.mark.parametrize("config", METHOD_CONFIGS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_method_config_parses(config):
    resolved = print_config(config)
    declared = yaml.safe_load(config.read_text())
    assert resolved["model"]["class_path"] == declared["model"]["class_path"]
    assert resolved["data"]["class_path"] == declared["data"]["class_path"]
    # the DataModule's tokenizer is a link target (set from the module), so it is not printed
    assert "tokenizer" not in (resolved["data"].get("init_args") or {})
    head = config.read_text().splitlines()[0]
    assert head.startswith("#"), f"{config} should open with a comment header giving the command"


@pytest.mark.parametrize("overlay", OVERLAY_CONFIGS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_overlay_config_composes_with_a_method(overlay):
    base = CONFIGS / "tldr" / "sft.yaml"
    resolved = print_config(base, overlay)
    declared = yaml.safe_load(overlay.read_text())
    for key, value in (declared.get("trainer") or {}).items():
        if not isinstance(value, (dict, list)):
            assert resolved["trainer"][key] == value, key


def test_datamodule_tokenizer_is_linked_to_the_model(tmp_path):
    cli = main(
        ["--config", str(CONFIGS / "tldr" / "sft.yaml"), "--model.init_args.model=tiny-random-llama",
         "--data.init_args.path=bundled:tldr_sft", "--trainer.logger=false", "--trainer.accelerator=cpu",
         "--trainer.precision=32", f"--trainer.default_root_dir={tmp_path}"],
        run=False,
    )
    assert cli.datamodule._tokenizer_arg == "tiny-random-llama"
    assert cli.model.hparams.tokenizer == "tiny-random-llama"
