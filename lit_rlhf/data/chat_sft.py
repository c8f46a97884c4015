"""Chat SFT: rows with a `messages` list ending with the assistant's answer (the `*_sft` splits of
`HuggingFaceH4/ultrafeedback_binarized` and of the bundled `keyfact_chat`), formatted as the
chat DataModules do (`lit_rlhf.data.ultrafeedback`), so the prompt is the online DataModule's."""

from __future__ import annotations

from typing import Any

from lit_rlhf.data import schema as schemas
from lit_rlhf.data.base import Formatter
from lit_rlhf.data.kinds import _ReferenceTexts, SFTDataModule
from lit_rlhf.data.formatting import chat_prompt_and_completion, require_messages
from lit_rlhf.data.processing import IDS, INT, STR, TRUNCATED
from lit_rlhf.data.ultrafeedback import ULTRAFEEDBACK_BINARIZED_HUB, _ChatFormatter


class ChatSFTFormatter(_ChatFormatter):
    """A row with `messages` -> chat prompt ids + answer ids (EOS last)."""

    consumed = ("messages", "chosen", "rejected", "prompt")

    def features(self) -> dict[str, Any]:
        return {"prompt": STR, "reference": STR, "_prompt_ids": IDS, "_completion_ids": IDS,
                "_prompt_len": INT, "_completion_len": INT, TRUNCATED: INT}

    def __call__(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        messages = require_messages(row.get("messages"), "messages")
        prompt, answer = chat_prompt_and_completion(self.tokenizer, messages)
        prompt_ids = self.prompt_ids(prompt, "messages")
        completion_ids, truncated = self.completion_ids(answer, "messages")
        return [{"prompt": prompt, "reference": answer, "_prompt_ids": prompt_ids, "_completion_ids": completion_ids,
                 "_prompt_len": len(prompt_ids), "_completion_len": len(completion_ids), TRUNCATED: truncated}]


class ChatSFTDataModule(_ReferenceTexts, SFTDataModule):
    """Chat SFT rows (`messages`, the last one the assistant's answer). Metadata: "prompt",
    "reference" (the answer) and the other source columns (e.g. `prompt_id`)."""

    defaults = {"path": ULTRAFEEDBACK_BINARIZED_HUB, "train_split": "train_sft", "val_split": "test_sft"}
    raw_schema = schemas.ULTRAFEEDBACK_SFT
    schema_name = "chat SFT (messages)"

    def _formatter(self, role: str) -> Formatter:
        return ChatSFTFormatter(self, passthrough=self.passthrough(role, ChatSFTFormatter.consumed))
