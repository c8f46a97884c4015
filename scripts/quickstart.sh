#!/usr/bin/env bash
# The main job: a miniature of the full RLHF pipeline on the embedded default model
# (SmolLM2-135M-Instruct) and the bundled TL;DR-style data, on a CPU, offline.
#
#   bash scripts/quickstart.sh            # after `bash scripts/install.sh`
#
# 1. reward model   python main.py fit --config configs/quickstart/reward.yaml
# 2. GRPO           python main.py validate --config configs/quickstart/grpo.yaml   (starting policy)
#                   python main.py fit --config configs/quickstart/grpo.yaml --config configs/quickstart/judge.yaml
# 3. judge          (the JudgeEvalCallback of judge.yaml, at the end of step 2's fit)
# then prints where everything is and the measured numbers. Outputs go to outputs/quickstart
# (replaced on each run). Extra arguments are passed to every `main.py` call.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT="${QUICKSTART_OUT:-outputs/quickstart}"
rm -rf "$OUT"
start=$(date +%s)
echo "== 1/3 reward model =="
python main.py fit --config configs/quickstart/reward.yaml "$@"
echo "== 2/3 GRPO: the starting policy on the validation prompts =="
python main.py validate --config configs/quickstart/grpo.yaml --trainer.logger.init_args.name grpo_start "$@"
echo "== 2/3 GRPO: training, then 3/3 judging against the starting policy =="
python main.py fit --config configs/quickstart/grpo.yaml --config configs/quickstart/judge.yaml "$@"
python scripts/quickstart_report.py "$OUT" --seconds $(( $(date +%s) - start ))
