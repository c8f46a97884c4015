#!/usr/bin/env bash
# The main job: a miniature of the full RLHF pipeline on the embedded default model
# (SmolLM2-135M-Instruct) and the bundled keyfact TL;DR-style data, on a CPU, offline, and a
# measure of whether it made the policy better that the policy never optimised.
#
#   bash scripts/quickstart.sh                      # after `bash scripts/install.sh`
#   bash scripts/quickstart.sh --seed_everything 2  # extra arguments go to both `main.py fit` calls
#
# 1. reward model   python main.py fit --config configs/quickstart/reward.yaml
#                   (the starting policy's own answers, paired and labelled by a noisy gold)
# 2. GRPO           python main.py fit --config configs/quickstart/grpo.yaml
# 3. evaluation     python -m lit_rlhf.apps.compare_policies: the starting and the trained policy on 64
#                   held-out posts; the reward model's score and the gold key-fact recall, paired
# then writes outputs/quickstart/results.json and prints every figure with its 95% interval.
# Outputs go to outputs/quickstart (the configs' output paths; replaced on each run).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=outputs/quickstart
rm -rf "$OUT"
start=$(date +%s)
echo "== 1/3 reward model =="
# (its validation on the held-out pairs is skipped: step 3 scores the same pairs, against the gold too)
python main.py fit --config configs/quickstart/reward.yaml --trainer.limit_val_batches 0 "$@"
echo "== 2/3 GRPO against the reward model =="
python main.py fit --config configs/quickstart/grpo.yaml "$@"
echo "== 3/3 the trained policy against the starting one, on held-out posts =="
python -m lit_rlhf.apps.compare_policies --before smollm2-135m-instruct --after "$OUT/policy" \
  --prompts bundled:keyfact_chat --data_class lit_rlhf.data.UltraFeedbackPromptDataModule --split test_sft \
  --num_prompts 64 --max_new_tokens 32 --batch_size 64 --reward_model "$OUT/reward_model" --missing_eos_score -1.5 \
  --pairs bundled:keyfact_chat --pairs_class lit_rlhf.data.UltraFeedbackPreferenceDataModule \
  --pairs_split test_prefs --pairs_gold scores --gold keyfact --output "$OUT/comparison.json" > "$OUT/comparison.log"
python scripts/quickstart_report.py "$OUT" --seconds $(( $(date +%s) - start ))
