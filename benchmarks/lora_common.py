"""What both LoRA benchmarks (`bench_lora.py`, `bench_lora_phases.py`) share: the adapter spec
from their flags, its `peft.LoraConfig`, the flags themselves and the JSON report writer.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def lora_spec(ns) -> dict[str, Any]:
    return {"r": ns.lora_r, "alpha": ns.lora_alpha, "target_modules": "all-linear"}


def peft_config(spec: dict[str, Any]):
    from lit_rlhf.models import adapters

    return adapters.lora_config(spec)


def lora_parser(description: str) -> argparse.ArgumentParser:
    """The flags both LoRA benchmarks take: the adapter
    (`--lora-r`, `--lora-alpha`), TRL's python, `--json`, and a worker's result file."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--lora-alpha", type=float, default=32.0)
    parser.add_argument("--trl-python", default="/tmp/benchvenv/bin/python")
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker-result", help=argparse.SUPPRESS)
    return parser


def parse_lora_args(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """(our flags, the method benchmark's): a worker gets its own flags, then the method
    benchmark's after `--`; otherwise the flags `parser` does not know pass through."""
    if "--" in argv:
        split = argv.index("--")
        return parser.parse_args(argv[:split]), argv[split + 1:]
    return parser.parse_known_args(argv)


def write_json(path: str | None, out: dict[str, Any]) -> None:
    """`out` as indented JSON at `path` (its folder made), nothing when `path` is None."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(out, indent=2))
