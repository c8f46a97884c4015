"""Environment observations as token ids, appended after the policy's sampled tokens.

Chat templates are not append-only: re-rendering a conversation can give other ids for the
policy's own turns (a merge across a turn boundary, a template that rewrites earlier turns). So
the policy's tokens stay as sampled, and `ChatFormat.observation_ids` tokenizes only the
continuation: the template applied to `[user, assistant(MARK)]` and to `[user, assistant(MARK),
*observation]` (with the generation prompt); what follows the first is the observation, up to
and including the next assistant generation prompt. The end of the assistant's turn (ChatML:
`<|im_end|>\n`) comes first: when it starts with EOS (SmolLM2) the sampled EOS wrote it and only
the rest (`\n`) is added; when EOS is another token (the tiny test tokenizer's `</s>`), the
policy writes the close itself, as chat SFT data teaches it
(`lit_rlhf.data.formatting.chat_prompt_and_completion`), and only its trailing whitespace is
added. Without a chat template the format is `\n<role>: content\n` per message, then
`\nassistant: `. Lone surrogates in environment text become U+FFFD (`envs.base.safe_text`).
"""

from __future__ import annotations

from typing import Any

from lit_rlhf.envs.base import Message, Observation, safe_text

_MARK = "\u2063lit_rlhf_assistant_turn\u2063"


class ChatFormat:
    """Renders observations for one tokenizer (see the module docstring)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.chat = bool(getattr(tokenizer, "chat_template", None))
        self._turn_suffix = self._find_turn_suffix() if self.chat else ""

    def _render(self, messages: list[Message], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def _find_turn_suffix(self) -> str:
        text = self._render([{"role": "user", "content": "u"}, {"role": "assistant", "content": _MARK}], False)
        close = text[text.index(_MARK) + len(_MARK):]
        eos = self.tokenizer.eos_token or ""
        if eos and close.startswith(eos):
            return close[len(eos):]
        return close[len(close.rstrip()):]

    def encode(self, text: str) -> list[int]:
        """Token ids of environment text: special-token text (`<|im_start|>`) becomes its
        special token, no BOS or EOS is added."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_text(self, observation: list[Message] | str) -> str:
        """The text of an episode's first observation: messages with the chat template and its
        generation prompt (plain format without a template), a string as it is."""
        if isinstance(observation, str):
            return safe_text(observation)
        if self.chat:
            return safe_text(self._render(list(observation), True))
        return safe_text("".join(f"{m['role']}: {m['content']}\n" for m in observation) + "assistant: ")

    def prompt_ids(self, observation: list[Message] | str) -> list[int]:
        """Token ids of an episode's first observation. Messages are encoded as chat-templated
        text is (`lit_rlhf.data.formatting.encode_prompt`: no BOS added, the template writes
        its own); a plain string gets the tokenizer's BOS when it adds one."""
        from lit_rlhf.data.formatting import encode_prompt

        return encode_prompt(self.tokenizer, self.prompt_text(observation), chat=not isinstance(observation, str))

    def observation_text(self, observation: Observation) -> str:
        """The text appended after a policy turn for `observation` ("" for None)."""
        if observation is None:
            return ""
        if isinstance(observation, str):
            return safe_text(observation)
        if not self.chat:
            return safe_text("".join(f"\n{m['role']}: {m['content']}" for m in observation) + "\nassistant: ")
        base: list[dict[str, Any]] = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _MARK}]
        before = self._render(base, False)
        after = self._render(base + list(observation), True)
        if not after.startswith(before):
            raise ValueError("the chat template renders earlier turns differently once an observation follows "
                             "them; environment observations cannot be appended to it")
        return safe_text(self._turn_suffix + after[len(before):])

    def observation_ids(self, observation: Observation) -> list[int]:
        """Token ids of `observation_text` (tokenized alone: the policy's ids before it stay
        as sampled)."""
        text = self.observation_text(observation)
        return self.encode(text) if text else []
