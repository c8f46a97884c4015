"""QADataModule: GSM8K and MATH schemas, the reference answer as a batch column, bad answers."""

from __future__ import annotations

import pytest

from lit_rlhf.data import BadRowError, QADataModule
from lit_rlhf.data.qa import last_boxed
from lit_rlhf.types import PromptBatch
from tests.data.conftest import write_jsonl


def test_bundled_arithmetic_gives_prompts_with_reference_answers():
    dm = QADataModule(tokenizer="tiny-random-llama", batch_size=4, prompt_template="Q: {question}\nA:")
    dm.setup("fit")
    assert len(dm.dataset("train")) == 600 and len(dm.dataset("val")) == 48
    batch = next(iter(dm.val_dataloader()))
    assert isinstance(batch, PromptBatch) and batch.input_ids.shape[0] == 4
    assert bool(batch.attention_mask[:, -1].all())  # left padded
    for prompt, ref, sol in zip(batch.meta["prompt"], batch.meta["reference"], batch.meta["solution"]):
        assert "Q: " in prompt and prompt.endswith("<|im_start|>assistant\n")  # one chat user turn
        assert sol.endswith(f"#### {ref}") and int(ref) >= 0
    prompts, refs = dm.references("test")
    assert len(prompts) == len(refs) == 200
    train_q = set(dm.dataset("train")["prompt"])
    assert not train_q & set(prompts)  # held-out questions


def test_math_schema_and_plain_prompts_from_a_local_file(tmp_path):
    path = write_jsonl(tmp_path / "math.jsonl", [
        {"problem": "Compute $\\frac{1}{2}+\\frac{1}{4}$.", "solution": "We get $\\boxed{\\frac{3}{4}}$.", "level": "1"},
        {"problem": "What is $2^{3}$?", "solution": "First \\boxed{4}? No: $2^3 = \\boxed{8}$.", "level": "2"},
    ])
    dm = QADataModule(path, tokenizer="tiny-random-llama", schema="math", chat=False, val_split=None,
                      test_split=None, batch_size=2, prompt_template="Problem: {question}\nSolution:")
    dm.setup("fit")
    ds = dm.dataset("train")
    assert ds["reference"] == ["\\frac{3}{4}", "8"]
    assert ds["level"] == ["1", "2"]  # other columns are kept as metadata
    assert ds["prompt"][0] == "Problem: Compute $\\frac{1}{2}+\\frac{1}{4}$.\nSolution:"


def test_last_boxed_matches_braces():
    assert last_boxed("so \\boxed{\\frac{a}{b}} and \\boxed{x^{2}}") == "x^{2}"
    assert last_boxed("\\fbox{3}") == "3"
    assert last_boxed("no box") is None
    assert last_boxed("\\boxed{unclosed") is None


@pytest.mark.parametrize("row, field, detail", [
    ({"question": "How many?", "answer": "just 4"}, "answer", "no '#### <answer>'"),
    ({"question": "How many?", "answer": "so\n#### "}, "answer", "empty final answer"),
    ({"question": "How many?", "answer": "#### ???"}, "answer", "cannot be parsed"),
    ({"question": "", "answer": "#### 4"}, "question", "empty"),
])
def test_bad_answers_are_named_or_counted(tmp_path, row, field, detail):
    good = {"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"}
    path = write_jsonl(tmp_path / "qa.jsonl", [good, row])
    kwargs = dict(tokenizer="tiny-random-llama", val_split=None, test_split=None)
    with pytest.raises(BadRowError, match=rf"row 1\): field '{field}': .*{detail}"):
        QADataModule(path, **kwargs).setup("fit")
    dm = QADataModule(path, on_bad_rows="skip", **kwargs)
    dm.setup("fit")
    assert len(dm.dataset("train")) == 1 and sum(dm.skipped_rows.values()) == 1
