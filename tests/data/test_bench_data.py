"""The data benchmark's generated files are of the real schemas: they load with no bad row."""

from __future__ import annotations

import importlib

import pytest

bench = importlib.import_module("benchmarks.bench_data")


@pytest.mark.parametrize("kind", bench.KINDS)
def test_generated_rows_load_clean(kind, tmp_path, monkeypatch, tldr_comparisons_sample, smollm2_tokenizer):
    monkeypatch.setattr(bench, "SHARED", tldr_comparisons_sample.parent.parent)
    path = bench.write_data(kind, 12, tmp_path / f"{kind}.jsonl")
    result = bench.worker(kind, str(path), 1, smollm2_tokenizer)  # lengths as in the benchmark
    per_row = 4 if kind == "ultrafeedback" else 1
    assert result["examples"] == 12 * per_row and result["skipped"] == 0 and result["seconds"] > 0
