"""Run the quickstart recipes as a new user would and write what each measured to results/recipes/.

    python scripts/run_recipes.py                 # every recipe, in the README's order
    python scripts/run_recipes.py dpo kto         # some of them

Each recipe runs as `python main.py fit --config configs/quickstart/<name>.yaml` from the
repository root, with no override; its wall time (model loading included) is measured around the
command. The validation scalars it logged (first and last value, and the steps) are read from its
TensorBoard event files; `results/recipes/<name>.json` gets them with the date, the machine and
its load. `python scripts/render_results.py` turns the files into the README's table and each method page's row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from lit_rlhf.apps.compare_policies import machine  # noqa: E402
from lit_rlhf.evaluation.logs import read_scalars as scalars  # noqa: E402
from render_results import RECIPES  # noqa: E402

def log_dir(config: dict) -> Path:
    args = config["trainer"]["logger"]["init_args"]
    return ROOT / args["save_dir"] / args["name"] / str(args.get("version") or "")


def run(name: str) -> dict:
    label, needs, tags = RECIPES[name]
    config_path = f"configs/quickstart/{name}.yaml"
    config = yaml.safe_load((ROOT / config_path).read_text())
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.time()
    done = subprocess.run([sys.executable, "main.py", "fit", "--config", config_path], cwd=ROOT, env=env)
    seconds = time.time() - start
    if done.returncode != 0:
        raise SystemExit(f"error: {config_path} exited with status {done.returncode}")
    logged = scalars(log_dir(config))
    validation = {}
    for tag in tags:
        points = logged.get(tag)
        if points:
            validation[tag.split("/", 1)[1]] = {"first": points[0][1], "last": points[-1][1], "count": len(points),
                                                "steps": [s for s, _ in points] if tag.startswith("val/") else []}
    return {"method": label, "order": list(RECIPES).index(name), "config": config_path,
            "needs": f"the {needs} recipe" if needs else None, "wall_seconds": round(seconds, 1),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "machine": machine(),
            "validation": validation}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"recipes to run (default: all of {', '.join(RECIPES)})")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in RECIPES]
    if unknown:
        parser.error(f"unknown recipe {unknown[0]!r}; choose from {', '.join(RECIPES)}")
    args.names = args.names or list(RECIPES)
    out = ROOT / "results" / "recipes"
    out.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        result = run(name)
        (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
        print(f"{name}: {result['wall_seconds']} s, {result['validation']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
