"""Render a GPU benchmark result file (`benchmarks.gpu.run --out`) as Markdown tables.

    python -m benchmarks.gpu.report benchmarks/results/gpu/2026-11-27-h100.json            # print
    python -m benchmarks.gpu.report benchmarks/results/gpu/2026-11-27-h100.json --write    # into RESULTS.md

`--write` replaces the text between the GPU markers of benchmarks/RESULTS.md (it adds them
after the `## GPU paths` section the first time), so the tables there always come from a file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.report import write_block

RESULTS_MD = Path(__file__).resolve().parents[1] / "RESULTS.md"
BEGIN, END = "<!-- gpu-benchmark:begin -->", "<!-- gpu-benchmark:end -->"


def _f(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def case_line(case: dict[str, Any]) -> str:
    """One case as the run prints it when it ends."""
    head = f"{case['size']:>13} {case['method']:>4} {case['framework']:>4}"
    if case["status"] != "ok":
        return f"{head}: {case['status']} ({case.get('reason') or case.get('error', '')[:300]})"
    phases = case["phases_s"]
    return (f"{head}: step {case['step_s']['median']:.3f}s, {case['tokens_per_s']:.0f} tok/s, MFU {_f(case['mfu'], '.1%')}"
            f" (update {_f(case['update_mfu'], '.1%')}), peak {_f(case['peak_gpu_mib'], '.0f')} MiB, gen "
            f"{_f(phases['generation'])}s, logprob {_f(phases['logprob_passes'])}s, update {_f(phases['update'])}s")


def strategy_line(record: dict[str, Any]) -> str:
    """One strategy's record as the run prints it."""
    if record["status"] != "ok":
        return f"strategy {record['strategy']:>16}: {record['status']} ({record.get('reason') or record.get('error', '')[:300]})"
    return (f"strategy {record['strategy']:>16}: step {record['step_s']['median']:.3f}s, {record['tokens_per_s']:.0f} tok/s, "
            f"MFU {_f(record['mfu'], '.1%')}, peak {_f(record['peak_gpu_mib'], '.0f')} MiB")


def _cell(text: str, limit: int = 160) -> str:
    """One table cell from free text (an error's last line): no newlines, no column bars."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "")[-limit:].replace("|", "/")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ratio(ours: dict[str, Any] | None, trl: dict[str, Any] | None) -> str:
    if not ours or not trl or ours.get("status") != "ok" or trl.get("status") != "ok":
        return "-"
    return f"{ours['step_s']['median'] / trl['step_s']['median']:.2f}"


def header(doc: dict[str, Any], source: str) -> str:
    gpu, v = doc["gpu"], doc["versions"]
    peak = gpu.get("peak_bf16_flops")
    measured = gpu.get("measured_bf16_matmul_flops")
    runs = doc.get("runs") or [{"date": doc["date"], "commit": doc.get("commit"), "elapsed_s": doc.get("elapsed_s"),
                                "load_average_before": doc["host"]["load_average_before"][0]}]
    when = "; ".join(f"{r['date'][:16].replace('T', ' ')} (commit {r.get('commit') or '?'}, {r.get('elapsed_s') or 0:.0f} s, "
                     f"host load average {r['load_average_before']:.1f} at the start)" for r in runs)
    parts = [
        f"Run on one {gpu['name']}"
        + (f" ({gpu.get('memory_gib')} GiB, driver {gpu.get('driver', '?')}, CUDA {gpu.get('cuda')})" if "memory_gib" in gpu else "")
        + f", {doc['host']['cpu_count']} host cores; torch {v['torch']}, transformers {v['transformers']}, lightning "
        f"{v['lightning']}" + (f", TRL {v['trl']}" if "trl" in v else ", TRL not installed") + f"; {doc['precision']}. "
        f"{'Runs' if len(runs) > 1 else 'Run'}: {when}. Raw {'files' if len(runs) > 1 else 'file'}: `{source}`.",
        "",
        f"MFU = the step's model FLOPs (`benchmarks/gpu/flops.py`: 6N per trained token, 2N per scored or generated "
        f"token, plus attention) / (median step seconds x peak). Peak: {_f(peak and peak / 1e12, '.1f')} TFLOP/s, the "
        f"datasheet's dense bf16 figure for this GPU"
        + (f"; a bf16 8192^3 matmul measured {measured / 1e12:.0f} TFLOP/s on it" if measured else "") + ". "
        "Update MFU counts only the trained passes against the update's time. Models: random weights from the "
        "published SmolLM2 configs (Llama shape, the SmolLM2 tokenizer), the same directory for both frameworks.",
    ]
    return "\n".join(parts)


def _setup(case: dict[str, Any]) -> str:
    """The case's wall seconds, and of them the set-up before its first step and the first step
    ('-' where the file predates their recording)."""
    info = case.get("info", {})
    return (f"{case['case_seconds']:.1f} ({_f(info.get('before_first_step_s'), '.1f')} / "
            f"{_f(info.get('first_step_s'), '.1f')})")


def method_table(doc: dict[str, Any]) -> str:
    rows = [
        "| size | method | framework | batch | step s, median (min-max) | tok/s | compl./s | MFU | update MFU | peak GPU MiB | gen / log-prob / update share | ours/TRL step | case s (before step 1 / step 1) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_key = {(c["size"], c["method"], c["framework"]): c for c in doc["cases"]}
    for c in doc["cases"]:
        label = f"| {c['size']} ({c['parameters'] / 1e9:.2f}B) | {c['method']} | {c['framework']} |"
        if c["status"] != "ok":
            rows.append(f"{label} | {c['status']}: {_cell(c.get('reason') or c.get('error', ''))} | | | | | | | |")
            continue
        s, share = c["step_s"], c["phase_share"]
        batch = f"{c['batch_size']}" + (f"x{c['extra']['generations']}" if c["method"] == "grpo" else "")
        shares = " / ".join(_pct(share[k]) for k in ("generation", "logprob_passes", "update"))
        ratio = _ratio(by_key.get((c["size"], c["method"], "ours")), by_key.get((c["size"], c["method"], "trl"))) if c["framework"] == "ours" else ""
        rows.append(f"{label} {batch} | {s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f}) | {c['tokens_per_s']:.0f} | "
                    f"{_f(c.get('completions_per_s'), '.1f')} | {_pct(c['mfu'])} | {_pct(c['update_mfu'])} | "
                    f"{_f(c['peak_gpu_mib'], '.0f')} | {shares} | {ratio} | {_setup(c)} |")
    return "\n".join(rows)


def strategy_table(doc: dict[str, Any]) -> str:
    if not doc.get("strategies"):
        return ""
    rows = ["| strategy overlay | size | step s, median (min-max) | tok/s | MFU | peak GPU MiB |", "|---|---|---|---|---|---|"]
    for r in doc["strategies"]:
        label = f"| {r['strategy']} | {r.get('size', '?')} |"
        if r["status"] != "ok":
            rows.append(f"{label} {r['status']}: {_cell(r.get('reason') or r.get('error', ''))} | | | |")
            continue
        s = r["step_s"]
        rows.append(f"{label} {s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f}) | {r['tokens_per_s']:.0f} | {_pct(r.get('mfu'))} | "
                    f"{_f(r.get('peak_gpu_mib'), '.0f')} |")
    return "\n".join(rows)


def render(doc: dict[str, Any], source: str) -> str:
    parts = [header(doc, source), "", method_table(doc)]
    strategies = strategy_table(doc)
    if strategies:
        parts += ["", "SFT (the same batch) under each strategy overlay of `configs/strategy/` on this one GPU "
                  "(`benchmarks/gpu/strategies.py`):", "", strategies]
    return "\n".join(parts)


def write(text: str, path: Path = RESULTS_MD) -> None:
    """Put `text` between the GPU markers of RESULTS.md (a section after `## GPU paths` the first time)."""
    write_block(text, BEGIN, END, "On one GPU: step time, MFU and memory against TRL (`benchmarks/gpu/`)",
                after="## GPU paths", path=path)


def merge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs on one machine as one: the first run's header, each case and strategy from the
    last run that measured it (a later run reruns what an earlier one skipped); the files must
    name the same GPU and versions."""
    first = docs[0]
    for doc in docs[1:]:
        if doc["gpu"]["name"] != first["gpu"]["name"] or doc["versions"] != first["versions"]:
            raise ValueError("the result files come from different GPUs or software versions: render them apart")
    cases: dict[tuple, dict[str, Any]] = {}
    strategies: dict[str, dict[str, Any]] = {}
    for doc in docs:
        for c in doc["cases"]:
            key = (c["size"], c["method"], c["framework"])
            if c["status"] == "ok" or key not in cases or cases[key]["status"] != "ok":
                cases[key] = c
        for r in doc.get("strategies", []):
            if r["status"] == "ok" or r["strategy"] not in strategies or strategies[r["strategy"]]["status"] != "ok":
                strategies[r["strategy"]] = r
    merged = dict(first, cases=list(cases.values()), strategies=list(strategies.values()))
    merged["runs"] = [{"date": d["date"], "commit": d.get("commit"), "elapsed_s": d.get("elapsed_s"),
                       "load_average_before": d["host"]["load_average_before"][0]} for d in docs]
    return merged


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="result files of runs on one machine (later files' cases win)")
    p.add_argument("--write", action="store_true", help="write into benchmarks/RESULTS.md between its GPU markers")
    ns = p.parse_args(argv)
    docs = [json.loads(Path(f).read_text()) for f in ns.results]
    sources = []
    for f in ns.results:
        try:
            sources.append(str(Path(f).resolve().relative_to(RESULTS_MD.parents[1])))
        except ValueError:
            sources.append(f)
    text = render(merge(docs), ", ".join(f"`{s}`" for s in sources).strip("`"))
    if ns.write:
        write(text)
    print(text)


if __name__ == "__main__":
    main()
