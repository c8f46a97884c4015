#!/usr/bin/env bash
# The main job: a miniature of the full RLHF pipeline on the embedded default model
# (SmolLM2-135M-Instruct) and the bundled keyfact TL;DR-style data, on a CPU, offline, and a
# measure of whether it made the policy better that the policy never saw.
#
#   bash scripts/quickstart.sh                      # after `bash scripts/install.sh`
#   bash scripts/quickstart.sh --seed_everything 2  # extra arguments go to both `main.py fit` calls
#   QUICKSTART_SPLIT=validation_sft bash scripts/quickstart.sh   # evaluate on the 32 validation posts
#   QUICKSTART_PROFILE=long bash scripts/quickstart.sh           # the longer profile (below; 10-15 min)
#
# Two more settings serve the selection of scripts/quickstart_select.py: QUICKSTART_GRPO_ARGS (extra
# arguments for step 2 only, e.g. "--model.init_args.kl_coef 0.04") and QUICKSTART_KEEP_REWARD=1
# (step 1 skipped: the reward model of the run before, same seed and profile, is kept).
#
# Settings are chosen on validation_sft (and without the held-out pairs, which are test posts'); the
# default test_sft (64 posts) reports a setting once chosen.
#
# 1. reward model   python main.py fit --config configs/quickstart/reward.yaml
#                   (the starting policy's own answers, paired and labelled by a noisy gold)
# 2. GRPO           python main.py fit --config configs/quickstart/grpo.yaml
# 3. evaluation     python -m lit_rlhf.apps.compare_policies: the starting and the trained policy on 64
#                   held-out posts, beside trivial answers copied from each post (its first sentence,
#                   title, the whole post) and the reference key fact; the reward model's score and the
#                   key-fact golds (recall, F1, distractors named, listed false statements), paired
# then writes outputs/quickstart/results.json and prints every figure with its 95% interval.
# Outputs go to outputs/quickstart (the configs' output paths; replaced on each run).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=outputs/quickstart
SPLIT=${QUICKSTART_SPLIT:-test_sft}
case "$SPLIT" in
  test_sft) PAIRS=bundled:keyfact_chat ;;
  validation_sft) PAIRS="" ;;  # the held-out pairs are the test posts': not read while choosing
  *) echo "error: QUICKSTART_SPLIT must be test_sft or validation_sft, got '$SPLIT'" >&2; exit 2 ;;
esac
REWARD=(--config configs/quickstart/reward.yaml)
GRPO=(--config configs/quickstart/grpo.yaml)
case "${QUICKSTART_PROFILE:-default}" in
  default) ;;
  # the same pipeline, longer: the reward model on all 216 training pairs (not the first 160), and GRPO
  # on 4 posts x 4 answers a rollout for 32 rollouts (512 episodes; the default: 2 x 4 for 9, 72)
  long) REWARD+=(--data.init_args.train_split train_prefs)
        GRPO+=(--data.init_args.batch_size 4 --model.init_args.total_episodes 512) ;;
  *) echo "error: QUICKSTART_PROFILE must be default or long, got '$QUICKSTART_PROFILE'" >&2; exit 2 ;;
esac
read -r -a GRPO_ARGS <<< "${QUICKSTART_GRPO_ARGS:-}"
start=$(date +%s)
if [[ "${QUICKSTART_KEEP_REWARD:-0}" == 1 ]]; then
  if [[ ! -d "$OUT/reward_model" ]]; then
    echo "error: QUICKSTART_KEEP_REWARD=1 but $OUT/reward_model does not exist: run once without it" >&2; exit 2
  fi
  rm -rf "$OUT/grpo" "$OUT/policy" "$OUT"/comparison.* "$OUT/results.json"
  echo "== 1/3 reward model: kept from the run before ($OUT/reward_model) =="
else
  rm -rf "$OUT"
  echo "== 1/3 reward model =="
  # (its validation on the held-out pairs is skipped: step 3 scores the same pairs, against the gold too)
  python main.py fit "${REWARD[@]}" --trainer.limit_val_batches 0 "$@"
fi
echo "== 2/3 GRPO against the reward model =="
python main.py fit "${GRPO[@]}" "${GRPO_ARGS[@]}" "$@"
echo "== 3/3 the trained policy against the starting one, on held-out posts =="
python -m lit_rlhf.apps.compare_policies --before smollm2-135m-instruct --after "$OUT/policy" \
  --prompts bundled:keyfact_chat --data_class lit_rlhf.data.UltraFeedbackPromptDataModule --split "$SPLIT" \
  --num_prompts 64 --max_new_tokens 32 --batch_size 64 --reward_model "$OUT/reward_model" --missing_eos_score -1.5 \
  --pairs "$PAIRS" --pairs_class lit_rlhf.data.UltraFeedbackPreferenceDataModule \
  --pairs_split test_prefs --pairs_gold scores --gold keyfact --checks bundled:keyfact_checks \
  --baselines first_sentence,title,post,reference --output "$OUT/comparison.json" > "$OUT/comparison.log"
python scripts/quickstart_report.py "$OUT" --seconds $(( $(date +%s) - start ))
