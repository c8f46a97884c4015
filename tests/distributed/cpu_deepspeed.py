"""Test-only: Lightning's DeepSpeedStrategy on CPU with gloo (`docs/ARCHITECTURE.md` section 4).

Lightning refuses DeepSpeed without CUDA. This subclass (1) sets up the environment as DDP does,
(2) skips the CUDA device-index check, and (3) passes `device_rank=self.local_rank` to
`deepspeed.initialize`, which is all ZeRO-2 and ZeRO-3 need to run with several CPU processes.
It exercises the same engine, partitioning and checkpoint code as on GPUs; it is not shipped.
"""

from __future__ import annotations

import argparse

from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy


class CPUDeepSpeedStrategy(DeepSpeedStrategy):
    strategy_name = "deepspeed_cpu_test"

    def setup_environment(self) -> None:
        DDPStrategy.setup_environment(self)  # no CUDA check

    def setup_distributed(self) -> None:
        reset_seed()  # no _validate_device_index_selection: CPU devices have no index
        self.set_world_ranks()
        self._init_deepspeed_distributed()

    def _setup_model_and_optimizer(self, model, optimizer, lr_scheduler=None):
        import deepspeed

        model_parameters = filter(lambda p: p.requires_grad, model.parameters())
        engine, ds_optimizer, _, _ = deepspeed.initialize(
            args=argparse.Namespace(device_rank=self.local_rank),
            config=self.config,
            model=model,
            model_parameters=model_parameters,
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            dist_init_required=False,
        )
        return engine, ds_optimizer

    def _initialize_deepspeed_inference(self, model) -> None:
        import deepspeed

        from lightning.pytorch.strategies.deepspeed import remove_module_hooks

        config = {"train_micro_batch_size_per_gpu": 1}
        if self.zero_stage_3:
            config.update(zero_allow_untested_optimizer=self.config["zero_allow_untested_optimizer"],
                          zero_optimization=self.config["zero_optimization"])
        remove_module_hooks(model)
        self.model, _, _, _ = deepspeed.initialize(
            args=argparse.Namespace(device_rank=self.local_rank), config=config, model=model, optimizer=None,
            lr_scheduler=None, model_parameters=[], dist_init_required=False,
        )
