#!/usr/bin/env bash
# The main job over several seeds, each result kept for the README:
#
#   bash scripts/quickstart_seeds.sh 1 2 3 4 5     # default: 1 2 3 4 5
#
# Each seed runs `scripts/quickstart.sh --seed_everything SEED` on an otherwise idle machine and
# its results.json is copied to results/quickstart/seedSEED.json; then
# `python scripts/render_results.py` rewrites the README's figures from those files.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p results/quickstart
for seed in "${@:-1 2 3 4 5}"; do
  for s in $seed; do
    bash scripts/quickstart.sh --seed_everything "$s"
    cp outputs/quickstart/results.json "results/quickstart/seed$s.json"
  done
done
python scripts/render_results.py
