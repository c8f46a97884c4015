"""The experiment drivers' `--set KEY=VALUE` budget overrides."""

from __future__ import annotations

from typing import Any, Sequence

import yaml


def parse_set(items: Sequence[str]) -> dict[str, Any]:
    """`["epochs=3", "seeds=[1, 2]"]` -> {"epochs": 3, "seeds": [1, 2]} (each value read as YAML)."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key] = yaml.safe_load(value)
    return overrides
