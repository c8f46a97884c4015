"""One LightningModule per method. Shared plumbing is in `base.PolicyModule`."""

from lit_rlhf.modules.base import PolicyModule
from lit_rlhf.modules.sft import SFTModule

__all__ = ["PolicyModule", "SFTModule"]
