"""Dataset rows -> prompt and completion texts and token ids, pure functions of (tokenizer, text):
the D2 TL;DR query (and the N+ reference code's CNN/DM query, its Detail 6) cut by paragraphs to
`max_prompt_length`; D3 completions (TL;DR: a leading space, the text, EOS; chat: the template's
continuation of the generation prompt, then EOS). Prompt and completion ids are encoded apart,
so the completion's never depend on where the prompt was cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

TLDR_TEMPLATE = "SUBREDDIT: r/{subreddit}\n\nTITLE: {title}\n\nPOST: {post}\n\nTL;DR:"
CNNDM_TEMPLATE = "Article:\n{article}\n\nTL;DR:\n"


class BadRow(ValueError):
    """A row that cannot become a training example. `reason` is a short stable category (used to
    count skipped rows), `field` names the offending column and `detail` says what is wrong."""

    def __init__(self, reason: str, field: str, detail: str = ""):
        self.reason = reason
        self.field = field
        self.detail = detail or reason
        super().__init__(f"{field}: {self.detail}")


class NoChatTemplateError(ValueError):
    """The tokenizer has no chat template but the data needs one."""


# Stable reasons for bad rows (the keys of the skip counters).
MISSING = "missing or empty field"
BAD_CHOICE = "choice not 0/1"
IDENTICAL = "identical chosen and rejected"
NON_FINITE = "non-finite score"
PROMPT_TOO_LONG = "prompt cannot be truncated to fit"
COMPLETION_TOO_LONG = "completion too long"
BAD_STRUCTURE = "malformed field"


def require_text(value: Any, field: str) -> str:
    """A non-empty string (whitespace only counts as empty), else `BadRow`."""
    if value is None:
        raise BadRow(MISSING, field, "missing (None)")
    if not isinstance(value, str):
        raise BadRow(BAD_STRUCTURE, field, f"expected a string, got {type(value).__name__}")
    if not value.strip():
        raise BadRow(MISSING, field, "empty string")
    return value


def require_finite(value: Any, field: str) -> float:
    """A finite real number (bool is not a number here), else `BadRow`."""
    import math

    if value is None:
        raise BadRow(MISSING, field, "missing (None)")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRow(NON_FINITE, field, f"expected a number, got {value!r}")
    if not math.isfinite(float(value)):
        raise BadRow(NON_FINITE, field, f"non-finite value {value!r}")
    return float(value)


def adds_bos(tokenizer) -> bool:
    """Whether `tokenizer(text)` prepends BOS on plain text (Llama does, GPT-2/SmolLM2 do not)."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return False
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return len(ids) > 0 and ids[0] == bos


def encode_prompt(tokenizer, text: str, *, chat: bool = False, bos: bool | None = None) -> list[int]:
    """Token ids of a prompt. Plain text gets the BOS the tokenizer would add (never an EOS);
    chat-templated text is encoded as is, since the template writes its own special tokens."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not chat and (adds_bos(tokenizer) if bos is None else bos):
        ids = [tokenizer.bos_token_id] + ids
    return list(ids)


def encode_completion(tokenizer, text: str) -> list[int]:
    """Token ids of a completion text followed by EOS (D3)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]


def fit_completion(ids: list[int], max_length: int, eos_token_id: int, *, truncate: bool, field: str) -> list[int]:
    """Apply the completion length cap. Over-long completions are a bad row (the N+ paper filters
    them), or, with `truncate=True`, cut to `max_length - 1` tokens followed by EOS."""
    if len(ids) <= max_length:
        return ids
    if not truncate:
        raise BadRow(COMPLETION_TOO_LONG, field,
                     f"{len(ids)} tokens (EOS included) > max_completion_length={max_length}")
    return ids[: max_length - 1] + [eos_token_id]


def format_tldr_query(subreddit: str, title: str, post: str) -> str:
    """D2: `SUBREDDIT: r/{subreddit}\\n\\nTITLE: {title}\\n\\nPOST: {post}\\n\\nTL;DR:` (no trailing space)."""
    return TLDR_TEMPLATE.format(subreddit=subreddit, title=title, post=post)


@dataclass(frozen=True)
class TruncatedQuery:
    text: str
    input_ids: list[int]
    paragraphs_dropped: int = 0  # number of cuts at the last "\n" of the post
    hard_truncated: bool = False  # the post was cut inside a paragraph (last resort)


def truncate_tldr_query(tokenizer, subreddit: str, title: str, post: str, max_length: int,
                        bos: bool | None = None) -> TruncatedQuery:
    """D2 query with the post shortened until the query fits in `max_length` tokens: drop the text
    after the post's last `\\n` (and the whitespace left before it) while too long; last resort,
    keep the post's leading tokens that fit; `BadRow` when even an empty post is too long."""
    return truncate_query(tokenizer, lambda body: format_tldr_query(subreddit, title, body), post, max_length,
                          body_field="post", head_field="title", bos=bos)


def format_cnndm_query(article: str) -> str:
    """The CNN/DM query of the N+ reference code (Detail 6): `Article:\\n{article}\\n\\nTL;DR:\\n`."""
    return CNNDM_TEMPLATE.format(article=article)


def truncate_cnndm_query(tokenizer, article: str, max_length: int, bos: bool | None = None) -> TruncatedQuery:
    """The CNN/DM query with the article cut as `truncate_tldr_query` cuts posts (the reference
    code's `truncate_field="article"`, `truncate_text="\\n"`)."""
    return truncate_query(tokenizer, format_cnndm_query, article, max_length, body_field="article",
                          head_field="article", bos=bos)


def truncate_query(tokenizer, render: Callable[[str], str], body: str, max_length: int, *, body_field: str,
                   head_field: str, bos: bool | None = None) -> TruncatedQuery:
    """`render(body)` with `body` shortened paragraph by paragraph (then token by token) until the
    query fits in `max_length` tokens; see `truncate_tldr_query`."""
    bos = adds_bos(tokenizer) if bos is None else bos
    text = render(body)
    ids = encode_prompt(tokenizer, text, bos=bos)
    dropped = 0
    while len(ids) > max_length and "\n" in body:
        shorter = body[: body.rfind("\n")].rstrip()
        if not shorter.strip():
            break  # only an empty first paragraph is left: hard-truncate the text kept so far
        body = shorter
        dropped += 1
        text = render(body)
        ids = encode_prompt(tokenizer, text, bos=bos)
    if len(ids) <= max_length and body.strip():
        return TruncatedQuery(text, ids, dropped, False)

    # hard truncation of the body's tokens, the template kept intact
    overhead = len(encode_prompt(tokenizer, render(""), bos=bos))
    if overhead >= max_length:
        raise BadRow(PROMPT_TOO_LONG, head_field, f"the query template without the {body_field} already takes "
                                                  f"{overhead} tokens >= max_prompt_length={max_length}")
    body_ids = tokenizer(body, add_special_tokens=False)["input_ids"]
    keep = min(len(body_ids), max_length - overhead)
    while keep > 0:
        # a cut inside a multi-byte character decodes to U+FFFD: drop it rather than invent text
        piece = tokenizer.decode(body_ids[:keep]).rstrip("\ufffd").rstrip()
        text = render(piece)
        ids = encode_prompt(tokenizer, text, bos=bos)
        if len(ids) <= max_length and piece:
            return TruncatedQuery(text, ids, dropped, True)
        keep -= 1
    raise BadRow(PROMPT_TOO_LONG, body_field,
                 f"no prefix of the {body_field} fits in max_prompt_length={max_length} tokens")


def format_tldr_completion(text: str) -> str:
    """D3 text part: exactly one leading space before the summary (the comparison summaries
    already start with one; the SFT summaries do not). EOS is appended as a token id."""
    return " " + text.lstrip()


def require_chat_template(tokenizer, source: str = "") -> None:
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise NoChatTemplateError(
            f"tokenizer {name!r} has no chat template, but {source or 'this data'} is formatted with one: "
            "use a chat model's tokenizer (e.g. 'smollm2-135m-instruct' or 'tiny-random-llama') or set "
            "`tokenizer.chat_template`"
        )


def chat_prompt_and_completion(tokenizer, messages: list[dict[str, str]]) -> tuple[str, str]:
    """(prompt text, completion text) of a conversation ending with an assistant message.

    The prompt is the template of every message but the last with the generation prompt; the
    completion is the template's continuation up to the end of the assistant turn, without the
    EOS (`encode_completion` appends its id): the text before EOS when the template ends turns
    with it (SmolLM2), else the turn end without trailing whitespace (the tiny test tokenizer)."""
    prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    if not full.startswith(prompt):
        raise ValueError(
            "the chat template's rendering of the whole conversation does not start with its generation prompt; "
            "prompt/completion cannot be split"
        )
    continuation = full[len(prompt):]
    content = messages[-1]["content"]
    if not continuation.startswith(content):
        raise ValueError("the chat template rewrites the assistant message; the completion cannot be taken as is")
    turn_end = continuation[len(content):]
    eos = tokenizer.eos_token
    if eos and eos in turn_end:
        turn_end = turn_end[: turn_end.index(eos)]
    else:
        turn_end = turn_end.rstrip()
    return prompt, content + turn_end


def chat_prompt(tokenizer, messages: list[dict[str, str]]) -> str:
    """The generation prompt for a conversation whose next message is the assistant's."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def require_messages(value: Any, field: str) -> list[dict[str, str]]:
    """A list of `{role, content}` messages ending with a non-empty assistant message."""
    if value is None:
        raise BadRow(MISSING, field, "missing (None)")
    if not isinstance(value, list) or not value:
        raise BadRow(MISSING if isinstance(value, list) else BAD_STRUCTURE, field,
                     "expected a non-empty list of messages")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise BadRow(BAD_STRUCTURE, f"{field}[{i}]", "expected a {role, content} message")
        role = require_text(message.get("role"), f"{field}[{i}].role")
        content = message.get("content")
        if i == len(value) - 1:
            content = require_text(content, f"{field}[{i}].content")
        elif not isinstance(content, str):
            raise BadRow(MISSING if content is None else BAD_STRUCTURE, f"{field}[{i}].content", "expected a string")
        out.append({"role": role, "content": content})
    if out[-1]["role"] != "assistant":
        raise BadRow(BAD_STRUCTURE, f"{field}[{len(out) - 1}].role",
                     f"the last message must be the assistant's, got {out[-1]['role']!r}")
    if len(out) < 2:
        raise BadRow(BAD_STRUCTURE, field, "the conversation has no message before the assistant's")
    return out
