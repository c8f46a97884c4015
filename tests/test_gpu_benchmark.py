"""The GPU benchmark (benchmarks/gpu/): its FLOPs counting against closed forms and real models,
and its CPU dry run (tiny shape, every method, the strategy worker, the report), so the script
cannot rot between the runs on a GPU."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.gpu import flops as F
from benchmarks.gpu import report, run


def test_smollm2_shapes_count_their_published_parameters():
    # 24 x (4 x 2048^2 + 3 x 2048 x 8192) + 49 norms x 2048 + 49152 x 2048 (tied)
    assert F.SHAPES["smollm2-1.7b"].parameters() == 1_711_376_384
    # 32 x (2 x 960^2 + 2 x 960 x 320 + 3 x 960 x 2560) + 65 x 960 + 49152 x 960
    assert F.SHAPES["smollm2-360m"].parameters() == 361_821_120


def test_shape_counts_match_the_model_transformers_builds():
    from transformers import AutoModelForCausalLM, LlamaConfig

    shape = F.ModelShape(layers=3, hidden=48, heads=6, kv_heads=2, intermediate=80, vocab=97)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**shape.llama_config()))
    assert sum(p.numel() for p in model.parameters()) == shape.parameters()
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert linear == shape.matmul_params()  # the tied output layer counted once, as a matmul


def test_flops_closed_forms():
    shape = F.ModelShape(layers=2, hidden=8, heads=2, kv_heads=1, intermediate=16, vocab=10)
    n = shape.matmul_params()
    assert n == 2 * (8 * 8 + 2 * 8 * 4 + 8 * 8 + 3 * 8 * 16) + 8 * 10
    assert F.forward_flops(shape, rows=3, length=5) == 3 * 5 * (2 * n + 4 * 2 * 8 * 5)
    assert F.train_flops(shape, 3, 5) == 3 * F.forward_flops(shape, 3, 5)
    # generation: the prefill, then token t (1-based) attends to prompt + t positions
    explicit = F.forward_flops(shape, 2, 4) + sum(2 * (2 * n + 4 * 2 * 8 * (4 + t)) for t in range(1, 4))
    assert F.generation_flops(shape, rows=2, prompt=4, new=3) == explicit
    dpo = F.step_flops("dpo", shape, batch=3, prompt=4, completion=1)
    assert dpo["update"] == F.train_flops(shape, 6, 5) and dpo["scoring"] == F.forward_flops(shape, 6, 5)
    ppo = F.step_flops("ppo", shape, batch=2, prompt=4, completion=3, ppo_epochs=4)
    scalar = F.train_flops(shape, 2, 7, head="scalar")
    assert scalar < F.train_flops(shape, 2, 7) and ppo["update"] == 4 * (F.train_flops(shape, 2, 7) + scalar)
    assert ppo["total"] == ppo["generation"] + ppo["scoring"] + ppo["update"]
    with pytest.raises(ValueError, match="unknown method"):
        F.step_flops("kto", shape, batch=1, prompt=1, completion=1)


def test_peak_flops_by_device_name():
    assert F.peak_bf16_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert F.peak_bf16_flops("NVIDIA H100 PCIe") == 756e12
    assert F.peak_bf16_flops("NVIDIA H200") == 989.4e12
    assert F.peak_bf16_flops("Some CPU") is None
    assert F.mfu(5e14, 1.0, 1e15) == 0.5 and F.mfu(1.0, 1.0, None) is None


def test_dry_run_measures_every_method_and_renders(tmp_path):
    out = tmp_path / "gpu.json"
    doc = run.main(["--dry-run", "--frameworks", "ours", "--strategies", "none,fsdp2", "--out", str(out)])
    assert json.loads(out.read_text())["cases"] == json.loads(json.dumps(doc["cases"]))
    cases = {c["method"]: c for c in doc["cases"]}
    assert set(cases) == set(run.METHODS) and all(c["status"] == "ok" for c in cases.values()), [c.get("error") for c in doc["cases"]]
    for method, case in cases.items():
        assert case["step_s"]["n"] == 1 and case["tokens_per_s"] > 0 and case["model_flops"]["total"] > 0
        info = case["info"]  # the case's seconds split: set-up before the first step, the first step, the rest
        assert 0 < info["before_first_step_s"] and 0 < info["first_step_s"]
        assert info["before_first_step_s"] + info["first_step_s"] < case["case_seconds"]
        if method in ("grpo", "ppo"):  # the phases are inside the step and together nearly all of it
            share = case["phase_share"]
            assert share["generation"] > 0 and share["logprob_passes"] > 0 and share["update"] > 0
            assert 0.5 < share["generation"] + share["logprob_passes"] + share["update"] <= 1.05
        else:
            assert case["phase_share"]["update"] == 1.0
    for record in doc["strategies"]:  # FSDP2 in one process on the CPU: the sharded path runs too
        assert record["status"] == "ok" and record["mfu"] is None and record["step_s"]["n"] == 1, record.get("error")
    assert [r["strategy_class"] for r in doc["strategies"]] == ["SingleDeviceStrategy", "ModelParallelStrategy"]
    results_md = tmp_path / "RESULTS.md"
    results_md.write_text("# R\n\n## GPU paths\n\ntext\n\n## Next\n")
    text = report.render(doc, str(out))
    report.write(text, results_md)
    report.write(text, results_md)  # idempotent: the block is replaced, not added twice
    md = results_md.read_text()
    assert md.count(report.BEGIN) == 1 and md.index("## GPU paths") < md.index(report.BEGIN) < md.index("## Next")
    assert "| tiny (0.00B) | grpo | ours | 2x4 |" in md


def test_results_md_shows_the_committed_gpu_runs():
    """The GPU table in benchmarks/RESULTS.md is the committed result files rendered, not typed."""
    files = sorted((report.RESULTS_MD.parent / "results" / "gpu").glob("*.json"))
    assert files, "no committed GPU run"
    docs = [json.loads(f.read_text()) for f in files]
    sources = ", ".join(f"`{f.relative_to(report.RESULTS_MD.parents[1])}`" for f in files).strip("`")
    md = report.RESULTS_MD.read_text()
    shown = md.split(report.BEGIN, 1)[1].split(report.END, 1)[0].strip("\n")
    assert shown == report.render(report.merge(docs), sources), "stale: python -m benchmarks.gpu.report <files> --write"
