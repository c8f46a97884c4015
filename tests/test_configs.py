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
    init = resolved["model"]["init_args"]
    # the DataModule's tokenizer is linked to the module's
    assert resolved["data"]["init_args"]["tokenizer"] == (init.get("tokenizer") or init["model"])
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
