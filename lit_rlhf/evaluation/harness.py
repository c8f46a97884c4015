"""A verifiable question/answer task for lm-evaluation-harness (`lm_eval`), from local files.

`write_task` writes a directory for `lm_eval --include_path`: `<name>.yaml` (local files read with
the `json` builder, greedy generation until a blank line or "Question:", the recipe's prompt
template) and `utils.py`, whose `process_results` scores with the verifiable reward's checker
(`rewards.math_answer.answers_match`), so `acc` is the accuracy `MathAnswerReward` rewards.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lit_rlhf.rewards.math_answer import answers_match

SCHEMAS = {"gsm8k": ("question", "answer"), "math": ("problem", "solution")}

UTILS = '''"""Written by lit_rlhf.evaluation.harness.write_task: scores a generation with lit_rlhf's checker."""

from lit_rlhf.evaluation.harness import process_results  # noqa: F401
'''

# `process_docs` tells `process_results` which field holds the reference when it is not `answer`
TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {files}
test_split: test
output_type: generate_until
doc_to_text: {text}
doc_to_target: {target}
{process_docs}process_results: !function utils.process_results
generation_kwargs:
  until: ["\\n\\n", "Question:"]
  do_sample: false
  max_gen_toks: {max_gen_toks}
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def process_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """The harness's per-document metric: `acc` 1.0 when the generation's final answer equals the
    reference's (`answers_match`), else 0.0. The reference field is the schema's answer field,
    named in the document by `_reference_field` (set by the task's `process_docs`) or `answer`."""
    field = doc.get("_reference_field", "answer")
    return {"acc": float(answers_match(str(doc[field]), results[0]))}


def write_task(out_dir: str | Path, data_files: list[str | Path], name: str = "lit_rlhf_qa", schema: str = "gsm8k",
               prompt_template: str = "Question: {question}\nAnswer:", max_gen_toks: int = 64) -> Path:
    """Write the task directory (`<out_dir>/<name>.yaml`, `utils.py`) and return it.

    data_files: local JSON/JSONL files of the `schema`'s rows (`gsm8k`: question, answer;
    `math`: problem, solution), read as the task's test split. `prompt_template` has one
    `{question}` field, as `QADataModule`'s."""
    if schema not in SCHEMAS:
        raise ValueError(f"schema must be one of {sorted(SCHEMAS)}, got {schema!r}")
    if "{question}" not in prompt_template:
        raise ValueError(f"prompt_template must contain '{{question}}', got {prompt_template!r}")
    files = [Path(f).resolve() for f in data_files]
    missing = [str(f) for f in files if not f.is_file()]
    if not files or missing:
        raise FileNotFoundError(f"the task's data files do not exist: {missing or 'none given'}")
    question, answer = SCHEMAS[schema]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = prompt_template.replace("{question}", "{{" + question + "}}")
    process_docs = "" if answer == "answer" else f"process_docs: !function utils.with_reference_{answer}\n"
    (out / f"{name}.yaml").write_text(TASK_YAML.format(
        name=name, files=json.dumps([str(f) for f in files]), text=json.dumps(text),
        target=json.dumps("{{" + answer + "}}"), process_docs=process_docs, max_gen_toks=int(max_gen_toks)))
    utils = UTILS
    if answer != "answer":
        utils += (f"\n\ndef with_reference_{answer}(dataset):\n"
                  f"    return dataset.map(lambda doc: {{'_reference_field': '{answer}'}})\n")
    (out / "utils.py").write_text(utils)
    return out
