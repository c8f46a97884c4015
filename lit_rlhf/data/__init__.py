"""DataModules for TL;DR, UltraFeedback (pairs, ranked lists, single trajectories, prompts, chat SFT) and question/answer data (GSM8K / MATH schemas), their formatting (D2, D3) and collators (D5)."""

from lit_rlhf.data.base import RLHFDataModule
from lit_rlhf.data.sources import BadRowError, DataSourceError, bundled_aliases
from lit_rlhf.data.formatting import BadRow, NoChatTemplateError
from lit_rlhf.data.chat_sft import ChatSFTDataModule
from lit_rlhf.data.qa import QADataModule
from lit_rlhf.data.tldr import TLDRPreferenceDataModule, TLDRPromptDataModule, TLDRSFTDataModule
from lit_rlhf.data.ultrafeedback import (
    UltraFeedbackPreferenceDataModule, UltraFeedbackPromptDataModule, UltraFeedbackSingleDataModule
)
from lit_rlhf.data.ultrafeedback_lists import UltraFeedbackListDataModule

__all__ = [
    "BadRow", "BadRowError", "ChatSFTDataModule", "DataSourceError", "NoChatTemplateError", "QADataModule",
    "RLHFDataModule", "TLDRPreferenceDataModule", "TLDRPromptDataModule", "TLDRSFTDataModule",
    "UltraFeedbackListDataModule", "UltraFeedbackPreferenceDataModule", "UltraFeedbackPromptDataModule",
    "UltraFeedbackSingleDataModule", "bundled_aliases"
]
