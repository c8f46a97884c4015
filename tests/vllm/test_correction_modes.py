"""Every rollout-correction mode fits GRPO, GSPO and RLOO sampling with the vLLM engine
(`rollout: VLLMSampler`), configured through the CLI from YAML (the session's engine attached
before the fit): the mismatch between engine and learner is logged, and with these matched
weights nothing is masked beyond what the mode's bounds and the engine's kernels give."""

from __future__ import annotations

import pytest

from lit_rlhf.cli import main
from tests.async_rollouts.test_correction_modes_cli import METHODS, MODES, check_fit, correction_config
from tests.vllm.conftest import attach


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("method", list(METHODS))
def test_every_correction_mode_fits_on_the_vllm_engine_through_the_cli(tmp_path, method, mode, vllm_model_dir, engine):
    source = {"class_path": "lit_rlhf.online.VLLMSampler"}
    cli = main(["--config", correction_config(method, mode, vllm_model_dir, source, tmp_path)], run=False)
    attach(cli.model, engine)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    check_fit(cli, mode)
    # the engine samples with the learner's weights (synced before the rollout): a small mismatch
    assert abs(float(cli.trainer.callback_metrics["train/rollout_correction/kl_k1"])) < 0.05
