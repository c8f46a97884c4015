"""The published raw schemas of the datasets we read, and strict type checks of raw rows.

A schema is written with Python types (`str`, `int`, `float`, `bool`), `[spec]` for a list and
`{key: spec}` for an object. Any field may be missing or null (the formatters name it); nothing
is coerced: `str` takes a JSON string only, `int` a JSON integer only (not `1.0`, `"1"`, `true`),
`float` any JSON number, `bool` `true` / `false`. `features(schema)` is the `datasets.Features` a
checked row is written with, so `datasets` never infers a column's type.
"""

from __future__ import annotations

from typing import Any

import datasets

Schema = dict[str, Any]

TLDR_SFT: Schema = {"id": str, "subreddit": str, "title": str, "post": str, "summary": str}
"""`vwxyzjn/summarize_from_feedback_tldr_3_filtered` (the SFT and prompt data)."""

TLDR_COMPARISONS: Schema = {
    "info": {"id": str, "post": str, "title": str, "subreddit": str, "site": str, "article": str},
    "split": str,
    "summaries": [{"text": str, "policy": str, "note": str}],
    "choice": int,
    "worker": str,
    "batch": str,
    "extra": {"confidence": int},
}
"""`openai/summarize_from_feedback`, config `comparisons` (the raw files have no `site` / `article`;
the CNN/DM rows of its validation split have an `article` and no `post`)."""

_MESSAGES = [{"content": str, "role": str}]
ULTRAFEEDBACK_BINARIZED: Schema = {
    "prompt": str, "prompt_id": str, "chosen": _MESSAGES, "rejected": _MESSAGES, "messages": _MESSAGES,
    "score_chosen": float, "score_rejected": float,
}
"""`HuggingFaceH4/ultrafeedback_binarized` (splits `train_prefs`, `test_prefs`, ...)."""

ULTRAFEEDBACK_SFT: Schema = {"prompt": str, "prompt_id": str, "messages": _MESSAGES}
"""The SFT splits of `HuggingFaceH4/ultrafeedback_binarized` (`train_sft`, `test_sft`): one conversation per row."""

_RATING = {"Rating": str, "Rationale": str}
_TYPED_RATING = {"Rating": str, "Rationale": str, "Type": [str], "Rationale For Rating": str}
ULTRAFEEDBACK: Schema = {
    "source": str,
    "instruction": str,
    "models": [str],
    "completions": [{
        "model": str, "response": str, "overall_score": float, "fine-grained_score": float,
        "annotations": {"helpfulness": _TYPED_RATING, "honesty": _RATING, "instruction_following": _RATING,
                        "truthfulness": _TYPED_RATING},
        "custom_system_prompt": str, "principle": str, "critique": str,
    }],
    "correct_answers": [str],
    "incorrect_answers": [str],
}
"""`openbmb/UltraFeedback` (one split, `train`)."""

ULTRAFEEDBACK_PROMPTS: Schema = {**ULTRAFEEDBACK_BINARIZED, **ULTRAFEEDBACK}
"""Either UltraFeedback schema (the prompt DataModule reads both)."""

GSM8K: Schema = {"question": str, "answer": str}
"""`openai/gsm8k` (configs `main`, `socratic`): the answer is a worked solution ending in `#### x`."""

MATH: Schema = {"problem": str, "solution": str, "level": str, "type": str}
"""The MATH dataset (Hendrycks et al. 2021): the final answer is the last `\\boxed{}` of `solution`."""

_VALUE = {str: "string", int: "int64", float: "float64", bool: "bool"}


def features(schema: Schema) -> datasets.Features:
    """The `datasets.Features` of rows of `schema`."""
    return datasets.Features({k: _feature(v) for k, v in schema.items()})


def _feature(spec: Any):
    if isinstance(spec, dict):
        return {k: _feature(v) for k, v in spec.items()}
    if isinstance(spec, list):
        return datasets.List(_feature(spec[0]))
    return datasets.Value(_VALUE[spec])


def found(value: Any) -> str:
    """A raw JSON value, named by its JSON type and shown (shortened)."""
    if isinstance(value, bool):
        return f"a boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"an integer {value}"
    if isinstance(value, float):
        return f"a number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"a string {shown!r}"
    if isinstance(value, list):
        return f"an array of {len(value)}"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


class TypeMismatch(Exception):
    """A raw value that does not have its schema type: `field` (dotted, with list indices) and
    `detail` ("expected ..., found ...")."""

    def __init__(self, field: str, detail: str):
        self.field, self.detail = field, detail
        super().__init__(f"{field}: {detail}")


_INT64 = (-(2**63), 2**63 - 1)


def conform(value: Any, spec: Any, field: str, unknown: dict[str, str] | None = None) -> Any:
    """`value` reduced to what `spec` declares (writable with `features(spec)`), or `TypeMismatch`
    at the first value not of `spec` (null is allowed everywhere). Undeclared object keys are
    dropped at every depth and recorded in `unknown` (`{dotted key: field of its first
    occurrence}`); a string must be valid Unicode (no unpaired surrogate), an `int` fit in 64 bits;
    an integer given for a `float` becomes that float."""
    if value is None:
        return None
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            raise TypeMismatch(field, f"expected an object, found {found(value)}")
        out = {}
        for k, v in value.items():
            name = f"{field}.{k}" if field else k
            if k not in spec:
                if unknown is not None:
                    unknown.setdefault(_strip_indices(name), name)
                continue
            out[k] = conform(v, spec[k], name, unknown)
        return out
    if isinstance(spec, list):
        if not isinstance(value, list):
            raise TypeMismatch(field, f"expected an array, found {found(value)}")
        item = spec[0]
        return [conform(v, item, f"{field}[{i}]", unknown) for i, v in enumerate(value)]
    if spec is str:
        if not isinstance(value, str):
            raise TypeMismatch(field, f"expected a string, found {found(value)}")
        try:
            value.isascii() or value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise TypeMismatch(field, f"expected a string of valid Unicode, found an unpaired surrogate "
                                      f"U+{ord(value[err.start]):04X} at character {err.start + 1}") from None
        return value
    if spec is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeMismatch(field, f"expected a number, found {found(value)}")
        if isinstance(value, int):
            try:
                return float(value)
            except OverflowError:
                raise TypeMismatch(field, f"expected a number within the 64-bit float range, found an integer "
                                          f"of {len(str(abs(value)))} digits") from None
        return value
    if spec is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeMismatch(field, f"expected an integer, found {found(value)}")
        if not _INT64[0] <= value <= _INT64[1]:
            raise TypeMismatch(field, f"expected a 64-bit integer, found an integer of {len(str(abs(value)))} "
                                      "digits")
        return value
    if not isinstance(value, spec):  # bool
        raise TypeMismatch(field, f"expected a boolean, found {found(value)}")
    return value


def _strip_indices(name: str) -> str:
    import re

    return re.sub(r"\[\d+\]", "[]", name)


def feature_kind(feature: Any) -> str:
    """'string' / 'int' / 'float' / 'bool' / 'list' / 'object' / other dtype of a `datasets` feature."""
    if isinstance(feature, dict):
        return "object"
    if isinstance(feature, (datasets.Sequence, datasets.List)) or isinstance(feature, list):
        inner = getattr(feature, "feature", None)
        if isinstance(feature, datasets.Sequence) and isinstance(inner, dict):
            return "object"  # datasets' Sequence of a dict is a dict of lists; accepted as-is
        return "list"
    dtype = getattr(feature, "dtype", "")
    if dtype in ("string", "large_string"):
        return "string"
    if dtype.startswith(("int", "uint")):
        return "int"
    if dtype.startswith("float"):
        return "float"
    if dtype == "bool":
        return "bool"
    return str(dtype or type(feature).__name__)


def spec_kind(spec: Any) -> str:
    if isinstance(spec, dict):
        return "object"
    if isinstance(spec, list):
        return "list"
    return {str: "string", int: "int", float: "float", bool: "bool"}[spec]


def check_features(feats: datasets.Features, schema: Schema) -> list[tuple[str, str, str]]:
    """(column, expected kind, found kind) of each top-level column of a typed dataset whose type
    does not match the schema (an int column is accepted where a float is expected); columns the
    schema does not declare are not checked."""
    bad = []
    for column, spec in schema.items():
        if column not in feats:
            continue
        want, have = spec_kind(spec), feature_kind(feats[column])
        if want != have and not (want == "float" and have == "int") and have != "null":
            bad.append((column, want, have))
    return bad
