"""Environment observations as token ids, appended after the policy's sampled tokens.

Chat templates are not append-only: rendering a whole conversation again and tokenizing it can
give other ids for the policy's own turns than the ones it sampled (a merge across a turn
boundary, a template that rewrites earlier turns). So the policy's tokens are kept as sampled,
and only the environment's new text is tokenized: `ChatFormat.observation_ids` renders the
observation messages as the continuation of a conversation whose last message is the
assistant's, and returns the ids of that continuation alone, up to and including the next
assistant generation prompt.

How the continuation is found with the tokenizer's chat template: the template is applied to
`[user, assistant(MARK)]` and to `[user, assistant(MARK), *observation]` (with the generation
prompt); the second starts with the first, and what follows is the observation's text. Before
it comes the end of the assistant's turn that the policy did not write: the template closes a
turn with some text after the assistant's content (ChatML: `<|im_end|>\\n`); when that close
starts with the EOS token (SmolLM2: `<|im_end|>` is EOS) the policy's sampled EOS wrote it, and
the rest (`\\n`) comes first in the observation's text. When the EOS is another token (the tiny
test tokenizer ends turns with `<|im_end|>` but its EOS is `</s>`), the policy writes the
close itself before EOS, as chat SFT data teaches it (`lit_rlhf.data.formatting.
chat_prompt_and_completion`), and only the close's trailing whitespace comes first.

A tokenizer without a chat template uses a plain format: `\\n<role>: content\\n` per message,
then `\\nassistant: `.

Environment text is made encodable first: a lone surrogate (what undecodable bytes read with
`surrogateescape` leave in a tool's or an environment's output) cannot be encoded by a fast
tokenizer and becomes U+FFFD (`lit_rlhf.envs.base.safe_text`).
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
