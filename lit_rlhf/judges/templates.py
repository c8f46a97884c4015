"""Judge prompts and the parsers of their replies.

A `JudgeTemplate` is a system message (optional), a user message with the fields {prompt}, {a}
and {b} (a = the completion shown first, labelled "A"; b = the one shown second, labelled "B"),
and how to read the verdict back:
- "preferred": the last `Preferred: A` / `Preferred: B` line (the TL;DR prompt);
- "brackets": the last `[[A]]`, `[[B]]` or `[[C]]` (= tie) (the MT-Bench pairwise prompt).
Parsing takes the LAST match so that a judge which quotes the format or changes its mind in its
explanation is read by its final answer. `answer_prefix` is what a local LM judge is made to have
already written before the verdict letter (it scores the next token instead of generating).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from lit_rlhf.judges.base import ShownVerdict

# TL;DR (the default "tldr"): the GPT-4 summary-comparison prompt of the N+ paper (Huang et al.
# 2024, Appendix I, and its reference code), which asks to judge "based on accuracy, coverage, and
# coherence". The post is the whole TL;DR query (D2 format), the summaries the completions.
_TLDR_QUESTION = ("Which of the following summaries does a better job of summarizing the most important points "
                  "in the given forum post, without including unimportant or irrelevant details? ")
_TLDR_FORMAT = ('FIRST provide a one-sentence comparison of the two summaries, explaining which you prefer and why. '
                'SECOND, on a new line, state only "A" or "B" to indicate your choice. Your response should use the '
                'format:\nComparison: <one-sentence comparison and explanation>\nPreferred: <"A" or "B">')
TLDR_USER = (_TLDR_QUESTION + "Judge based on accuracy, coverage, and coherence.\n\n### Post:\n{prompt}\n\n"
             "### Summary A:\n{a}\n\n### Summary B:\n{b}\n\n### Instructions:\n" + _TLDR_FORMAT)

# TL;DR as the DPO paper judged it ("tldr_dpo": Rafailov et al. 2023, Appendix C.2, the
# "conciseness" summarization prompt): "A good summary is both precise and concise."
TLDR_DPO_USER = (_TLDR_QUESTION + "A good summary is both precise and concise.\n\nPost:\n{prompt}\n\n"
                 "Summary A:\n{a}\n\nSummary B:\n{b}\n\n" + _TLDR_FORMAT)

# General chat: the MT-Bench pairwise comparison (single turn) prompt.
MT_BENCH_SYSTEM = (
    "Please act as an impartial judge and evaluate the quality of the responses provided by two AI "
    "assistants to the user question displayed below. You should choose the assistant that follows "
    "the user's instructions and answers the user's question better. Your evaluation should consider "
    "factors such as the helpfulness, relevance, accuracy, depth, creativity, and level of detail of "
    "their responses. Begin your evaluation by comparing the two responses and provide a short "
    "explanation. Avoid any position biases and ensure that the order in which the responses were "
    "presented does not influence your decision. Do not allow the length of the responses to "
    "influence your evaluation. Do not favor certain names of the assistants. Be as objective as "
    "possible. After providing your explanation, output your final verdict by strictly following "
    'this format: "[[A]]" if assistant A is better, "[[B]]" if assistant B is better, and "[[C]]" '
    "for a tie."
)
MT_BENCH_USER = ("[User Question]\n{prompt}\n\n[The Start of Assistant A's Answer]\n{a}\n[The End of Assistant A's "
                 "Answer]\n\n[The Start of Assistant B's Answer]\n{b}\n[The End of Assistant B's Answer]")

_FIELDS = re.compile(r"\{(prompt|a|b)\}")
# "Preferred: A", 'Preferred: "B"', "**Preferred:** A", "preferred - (A)"; the letter must be a
# capital standing alone (so "Preferred: a summary" is not read as A).
_PREFERRED = re.compile(r"(?i:preferred)\W{0,6}?([AB])(?![A-Za-z0-9])")
_BRACKETS = re.compile(r"\[\[\s*([ABC])\s*\]\]")

Parser = Literal["preferred", "brackets", "any"]


_PATTERNS = {"preferred": (_PREFERRED,), "brackets": (_BRACKETS,), "any": (_PREFERRED, _BRACKETS)}


def parse_verdict(text: str, parser: Parser = "any") -> ShownVerdict | None:
    """The verdict that occurs last in `text` as "first"/"second"/"tie", None if there is none:
    `Preferred: A|B` ("preferred"), `[[A]]`/`[[B]]`/`[[C]]` (= tie, "brackets"), or either ("any")."""
    found = [(m.start(), m.group(1)) for pattern in _PATTERNS[parser] for m in pattern.finditer(text)]
    return {"A": "first", "B": "second", "C": "tie"}[max(found)[1]] if found else None


@dataclass(frozen=True)
class JudgeTemplate:
    """A judge prompt: optional system message, user message with {prompt}/{a}/{b}, reply parser."""

    name: str
    user: str
    system: str | None = None
    parser: Parser = "any"
    answer_prefix: str = ""

    def __post_init__(self) -> None:
        missing = {"prompt", "a", "b"} - set(_FIELDS.findall(self.user))
        if missing:
            fields = sorted("{" + m + "}" for m in missing)
            raise ValueError(f"judge template {self.name!r} lacks the field(s) {fields}")
        if self.parser not in _PATTERNS:
            raise ValueError(f"unknown parser {self.parser!r}; expected one of {sorted(_PATTERNS)}")

    def render(self, prompt: str, first: str, second: str) -> str:
        """The user message. One pass over the template, so braces in the texts are left alone."""
        values = {"prompt": prompt, "a": first, "b": second}
        return _FIELDS.sub(lambda m: values[m.group(1)], self.user)

    def messages(self, prompt: str, first: str, second: str) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + [{"role": "user", "content": self.render(prompt, first, second)}]

    def parse(self, text: str) -> ShownVerdict | None:
        return parse_verdict(text, self.parser)


TEMPLATES: dict[str, JudgeTemplate] = {
    "tldr": JudgeTemplate("tldr", TLDR_USER, parser="preferred", answer_prefix="Preferred:"),
    "tldr_dpo": JudgeTemplate("tldr_dpo", TLDR_DPO_USER, parser="preferred", answer_prefix="Preferred:"),
    "mt_bench": JudgeTemplate("mt_bench", MT_BENCH_USER, system=MT_BENCH_SYSTEM, parser="brackets", answer_prefix="[["),
}


def get_template(template: str | dict | JudgeTemplate) -> JudgeTemplate:
    """A builtin name ("tldr", "tldr_dpo", "mt_bench"), a custom user-message string with {prompt}/{a}/{b},
    a JudgeTemplate, or the dict of one's fields (as `dataclasses.asdict` writes it)."""
    if isinstance(template, JudgeTemplate):
        return template
    if isinstance(template, dict):
        return JudgeTemplate(**template)
    if template in TEMPLATES:
        return TEMPLATES[template]
    if _FIELDS.search(template):
        return JudgeTemplate("custom", template, parser="any")
    raise ValueError(
        f"unknown judge template {template!r}: use one of {sorted(TEMPLATES)} or a string with {{prompt}}, {{a}}, {{b}}"
    )
