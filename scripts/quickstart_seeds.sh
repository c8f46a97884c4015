#!/usr/bin/env bash
# The main job over several seeds, each result kept for the README and docs/getting-started.md:
#
#   bash scripts/quickstart_seeds.sh 6 7         # default: 1 2 3 4 5
#   QUICKSTART_PROFILE=long bash scripts/quickstart_seeds.sh 10 11   # the longer profile: results/quickstart/long/
#
# Each seed runs `scripts/quickstart.sh --seed_everything SEED` on an otherwise idle machine and
# its results.json is copied to results/quickstart/seedSEED.json; the golds of their saved answers,
# beside the trivial answers and pooled over the seeds, go to results/quickstart/golds/seedsFIRST-LAST.json
# (`python -m lit_rlhf.apps.compare_policies --rescore`); then `python scripts/render_results.py`
# rewrites the figures of the README and the docs pages from those files.
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=(${@:-1 2 3 4 5})
if [[ "${QUICKSTART_PROFILE:-default}" == long ]]; then
  dir=results/quickstart/long; golds=$dir/golds.json
else
  dir=results/quickstart; golds="$dir/golds/seeds${seeds[0]}-${seeds[-1]}.json"
fi
mkdir -p "$dir"
files=()
for s in "${seeds[@]}"; do
  bash scripts/quickstart.sh --seed_everything "$s"
  cp outputs/quickstart/results.json "$dir/seed$s.json"
  files+=("$dir/seed$s.json")
done
python -m lit_rlhf.apps.compare_policies --rescore "${files[@]}" \
  --checks bundled:keyfact_checks --baselines first_sentence,title,post,reference \
  --output "$golds" > /dev/null
python scripts/render_results.py
