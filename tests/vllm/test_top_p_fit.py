"""A GRPO fit sampling with top-p 0.9 through vLLM's CPU engine with a token mask correction: the
learner's log-probs replay the filter, so the logged mismatch is rounding and no token is masked;
with the replay off every token's ratio is the kept mass (about 0.9)."""

from __future__ import annotations

import yaml

from lit_rlhf.cli import main
from tests.async_rollouts.test_correction_modes_cli import correction_config
from tests.vllm.conftest import attach


def test_grpo_top_p_fit_logs_no_numerical_mismatch(tmp_path, vllm_model_dir, engine):
    path = correction_config("grpo", "mask_token", vllm_model_dir, {"class_path": "lit_rlhf.online.VLLMSampler"}, tmp_path)
    config = yaml.safe_load(open(path))
    config["model"]["init_args"].update(top_p=0.9, max_new_tokens=8)
    open(path, "w").write(yaml.safe_dump(config))
    metrics = {}
    for replay in (True, False):
        cli = main(["--config", path], run=False)
        if not replay:
            cli.model.logprob_filter = (0, 1.0)
        attach(cli.model, engine)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        metrics[replay] = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if "rollout_correction" in k}
    print(metrics)
    assert abs(metrics[True]["train/rollout_correction/kl_k1"]) < 1e-4
    assert metrics[True]["train/rollout_correction/masked_fraction"] == 0.0
    assert metrics[False]["train/rollout_correction/kl_k1"] > 0.05
