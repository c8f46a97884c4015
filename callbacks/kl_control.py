"""Fixed or adaptive control of the KL coefficient (Ziegler et al. 2019), as a callback."""

from __future__ import annotations

from typing import Any

import torch
from lightning import Callback

from lit_rlhf.modules.online import OnlineModule
from lit_rlhf.ops import masked_sum
from lit_rlhf.types import Rollout


class KLControlCallback(Callback):
    """Controls the KL coefficient of an `OnlineModule` (PPO, GRPO, RLOO): its `kl_coef`, set
    through its `set_kl_coef` hook.

    Fixed control (`target` None) sets the coefficient to `init_kl_coef` when training starts
    and keeps it. Adaptive control ("Fine-Tuning Language Models from Human Preferences",
    Ziegler et al. 2019, Sec. 2.2) measures, once the rollout is final (`on_rollout_end`), its KL
    `KL = mean over responses of sum_t (log pi - log pi_ref)` (nats per response, k1; averaged
    over ranks) and, after the step's updates, sets

        e = clip(KL / target - 1, -clip, clip)
        kl_coef <- kl_coef * (1 + e * n_steps / horizon)

    where `n_steps` is the number of episodes (responses, all ranks) of the rollout. The
    coefficient used for a rollout's rewards therefore depends only on earlier rollouts, as in
    Ziegler et al.'s code. The coefficient is in `state_dict()`, so checkpoints carry it and a
    resumed run continues from it. Logs `train/objective/kl_coef` every step.

    Args:
        init_kl_coef: starting coefficient; None = the module's own (its `kl_coef`).
        target: target KL in nats per response (Ziegler et al.: 6.0); None = fixed control.
        horizon: episodes over which the proportional error acts (Ziegler et al.: 10000).
        clip: bound of the proportional error (0.2).
    """

    def __init__(
        self,
        init_kl_coef: float | None = None,
        target: float | None = None,
        horizon: int = 10000,
        clip: float = 0.2,
    ) -> None:
        if init_kl_coef is not None and init_kl_coef < 0:
            raise ValueError(f"init_kl_coef must be >= 0, got {init_kl_coef}")
        if target is not None and target <= 0:
            raise ValueError(f"target must be > 0 (or None for a fixed coefficient), got {target}")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        if clip < 0:
            raise ValueError(f"clip must be >= 0, got {clip}")
        self.init_kl_coef = init_kl_coef
        self.target = target
        self.horizon = horizon
        self.clip = clip
        self.kl_coef: float | None = init_kl_coef
        self._pending: tuple[float, int] | None = None  # (measured KL, episodes) of the last rollout

    @property
    def adaptive(self) -> bool:
        return self.target is not None

    def update(self, current_kl: float, n_steps: int) -> float:
        """One Ziegler et al. update of `self.kl_coef` from a measured KL; returns the new value."""
        if self.kl_coef is None:
            raise RuntimeError("KLControlCallback has no coefficient yet: set init_kl_coef or attach it to a module")
        if not self.adaptive:
            return self.kl_coef
        error = min(max(current_kl / self.target - 1.0, -self.clip), self.clip)
        self.kl_coef = self.kl_coef * (1.0 + error * n_steps / self.horizon)
        return self.kl_coef

    @staticmethod
    def _controlled(pl_module) -> OnlineModule:
        if not isinstance(pl_module, OnlineModule):
            raise TypeError(f"KLControlCallback controls the kl_coef of an OnlineModule (PPO, GRPO, RLOO); "
                            f"{type(pl_module).__name__} is not one")
        return pl_module

    def on_train_start(self, trainer, pl_module) -> None:
        module = self._controlled(pl_module)
        if self.kl_coef is None:
            self.kl_coef = float(module.kl_coef)
        if self.adaptive and self.kl_coef == 0:
            raise ValueError(
                f"adaptive KL control cannot move a coefficient of 0 ({type(module).__name__}.kl_coef); "
                "set init_kl_coef > 0 (and, for GRPO and RLOO, the module's kl_coef > 0, which loads the reference model)"
            )
        module.set_kl_coef(self.kl_coef)

    def on_rollout_end(self, trainer, pl_module, rollout: Rollout) -> None:
        if self.adaptive:
            if rollout.ref_logps is None:
                raise ValueError("adaptive KL control needs reference log-probs; this rollout has none (kl_coef 0?)")
            if rollout.logps is None:
                raise ValueError(f"adaptive KL control needs the policy's log-probs of the rollout; "
                                 f"{type(pl_module).__name__} does not compute them")
            kl = masked_sum(rollout.logps - rollout.ref_logps, rollout.loss_mask, dim=1).mean()  # k1, per response
            kl = trainer.strategy.reduce(kl.detach().float(), reduce_op="mean") if trainer is not None else kl
            world = trainer.world_size if trainer is not None else 1
            self._pending = (float(kl), int(rollout.response_ids.shape[0]) * max(1, world))

    def on_train_batch_end(self, trainer, pl_module, outputs: Any, batch: Any, batch_idx: int) -> None:
        pl_module.log("train/objective/kl_coef", torch.tensor(float(self.kl_coef)), on_step=True, on_epoch=False)
        if self._pending is not None:
            current, n_steps = self._pending
            self._pending = None
            self._controlled(pl_module).set_kl_coef(self.update(current, n_steps))

    def state_dict(self) -> dict[str, Any]:
        return {"kl_coef": self.kl_coef, "target": self.target, "horizon": self.horizon, "clip": self.clip}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.kl_coef = state_dict["kl_coef"]
