#!/usr/bin/env bash
# The GPU paths, run for real on a CUDA machine: one command, one pass/fail line per check, a summary.
#
#   bash scripts/gpu_check.sh                # on a GPU node, after `bash scripts/install.sh` with a CUDA
#                                            # torch (TORCH_SPEC="torch") and VLLM_SPEC="vllm"
#   bash scripts/gpu_check.sh --print        # list the checks and their commands (any machine)
#   bash scripts/gpu_check.sh --only grpo-vllm --only sft-packed-varlen   # some checks only
#
# The checks (a few optimizer steps each, on the embedded SmolLM2-135M-Instruct and the bundled data):
#   <method>-bf16       every quickstart recipe (configs/quickstart: sft reward dpo kto drov ppo grpo)
#                       on one GPU under bf16-mixed precision, validating along the way; reward runs
#                       first (ppo and grpo score with the reward model it exports)
#   grpo-vllm           GRPO with rollout: VLLMSampler (a vLLM engine colocated in the training
#                       process, in bf16, its weights reloaded from the policy after every optimizer
#                       step); passes when the fit ends and the logged train/rollout/sampler_logprob_diff
#                       (mean |log pi_train - log pi_sampler|) is finite and below 0.5
#   sft-zero2, sft-zero3  a single-GPU DeepSpeed fit, ZeRO-2 and ZeRO-3 (configs/strategy), bf16-mixed
#   sft-packed-varlen   packed SFT (data.packing: true): the policy runs sdpa_varlen on CUDA
#   logprobs-chunked-bf16  chunked log-probs against the dense path under bf16 autocast and in fp32,
#                       values and output-layer gradients (scripts/gpu_check_logprobs.py)
# A fit passes when it exits 0 and prints its "run stopped:" line. Without a CUDA device the script
# says so and exits 1 (--print works anywhere). Outputs and one log per check go to
# GPU_CHECK_DIR (default: a new directory under /tmp); a failed check prints its log's last lines.
# Environment: PYTHON (default python), GPU_CHECK_TIMEOUT (seconds per check, default 1800).
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python}"
QUICK="$REPO/configs/quickstart"
STRATEGY="$REPO/configs/strategy"

MODE=run
ONLY=()
while [ $# -gt 0 ]; do
  case "$1" in
    --print|--dry-run) MODE=print ;;
    --only) shift; ONLY+=("${1:?--only needs a check name}") ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

NAMES=()
COMMANDS=()
# add NAME ARG...: a check whose command is ARG... (each argument shell-quoted)
add() {
  local name="$1"; shift
  local quoted
  printf -v quoted '%q ' "$@"
  NAMES+=("$name")
  COMMANDS+=("${quoted% }")
}

GPU=(--trainer.accelerator=gpu --trainer.devices=1 --trainer.precision=bf16-mixed)
VALIDATE=(--trainer.val_check_interval=1 --trainer.limit_val_batches=1)
OFFLINE=(--trainer.max_steps=3 "${VALIDATE[@]}")
FIT=("$PY" "$REPO/main.py" fit)

# every quickstart recipe under bf16-mixed (reward first: ppo and grpo read its exported model)
add reward-bf16 "${FIT[@]}" --config "$QUICK/reward.yaml" "${GPU[@]}" --trainer.max_steps=3 --trainer.limit_val_batches=1
for method in sft dpo kto drov; do
  add "$method-bf16" "${FIT[@]}" --config "$QUICK/$method.yaml" "${GPU[@]}" "${OFFLINE[@]}"
done
add ppo-bf16 "${FIT[@]}" --config "$QUICK/ppo.yaml" "${GPU[@]}" --model.init_args.total_episodes=8 "${VALIDATE[@]}"
add grpo-bf16 "${FIT[@]}" --config "$QUICK/grpo.yaml" "${GPU[@]}" --model.init_args.total_episodes=16 "${VALIDATE[@]}"
# GRPO sampling with a colocated vLLM engine, synced after every optimizer step
add grpo-vllm "${FIT[@]}" --config "$QUICK/grpo.yaml" "${GPU[@]}" --model.init_args.total_episodes=24 "${VALIDATE[@]}" \
  '--model.init_args.rollout={"class_path": "lit_rlhf.online.VLLMSampler", "init_args": {"engine_kwargs": {"gpu_memory_utilization": 0.3, "dtype": "bfloat16"}}}' \
  --trainer.logger.init_args.name=grpo_vllm --model.init_args.export_dir=outputs/quickstart/policy_vllm
# single-GPU DeepSpeed
for stage in 2 3; do
  add "sft-zero$stage" "${FIT[@]}" --config "$QUICK/sft.yaml" --config "$STRATEGY/deepspeed_zero$stage.yaml" "${GPU[@]}" \
    "${OFFLINE[@]}" --trainer.logger.init_args.name="sft_zero$stage" \
    --model.init_args.export_dir="outputs/quickstart/sft_zero${stage}_model"
done
# packed SFT: sdpa_varlen attention on CUDA
add sft-packed-varlen "${FIT[@]}" --config "$QUICK/sft.yaml" "${GPU[@]}" "${OFFLINE[@]}" --data.init_args.packing=true \
  --trainer.logger.init_args.name=sft_packed --model.init_args.export_dir=outputs/quickstart/sft_packed_model
# chunked log-probs against dense under bf16
add logprobs-chunked-bf16 "$PY" "$REPO/scripts/gpu_check_logprobs.py" --device cuda --model smollm2-135m-instruct

selected() {
  [ ${#ONLY[@]} -eq 0 ] && return 0
  local name
  for name in "${ONLY[@]}"; do [ "$name" = "$1" ] && return 0; done
  return 1
}

for name in "${ONLY[@]}"; do
  known=0
  for n in "${NAMES[@]}"; do [ "$n" = "$name" ] && known=1; done
  [ $known -eq 1 ] || { echo "gpu_check: unknown check $name (known: ${NAMES[*]})" >&2; exit 2; }
done

if [ "$MODE" = print ]; then
  for i in "${!NAMES[@]}"; do
    selected "${NAMES[$i]}" && printf '%s\t%s\n' "${NAMES[$i]}" "${COMMANDS[$i]}"
  done
  exit 0
fi

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  version="$("$PY" -c 'import torch; print(torch.__version__, "built for CUDA", torch.version.cuda or "none")' 2>/dev/null \
    || echo 'not importable')"
  echo "gpu_check: no CUDA device: torch $version sees no GPU. These checks need a CUDA machine" \
       "(bash scripts/gpu_check.sh --print lists what they run)." >&2
  exit 1
fi

WORK="${GPU_CHECK_DIR:-$(mktemp -d /tmp/lit_rlhf_gpu_check.XXXXXX)}"
mkdir -p "$WORK/logs"
cd "$WORK" || exit 1  # the recipes write under ./outputs/quickstart
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" HF_DATASETS_OFFLINE="${HF_DATASETS_OFFLINE:-1}" TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1
echo "gpu_check: $("$PY" -c 'import torch; print(torch.cuda.get_device_name(0), "| torch", torch.__version__, "| CUDA", torch.version.cuda)'); outputs in $WORK"

# the extra pass condition of grpo-vllm: the sampler's log-probs logged, finite and close to the trainer's
vllm_diff() {
  "$PY" - "$WORK/outputs/quickstart/grpo_vllm" <<'EOF'
import math, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
values = [e.value for e in acc.Scalars("train/rollout/sampler_logprob_diff")] if "train/rollout/sampler_logprob_diff" in acc.Tags()["scalars"] else []
print(f"train/rollout/sampler_logprob_diff: {values}")
sys.exit(0 if values and all(math.isfinite(v) and v < 0.5 for v in values) else 1)
EOF
}

PASSED=()
FAILED=()
for i in "${!NAMES[@]}"; do
  name="${NAMES[$i]}"
  selected "$name" || continue
  log="$WORK/logs/$name.log"
  start=$(date +%s)
  timeout "${GPU_CHECK_TIMEOUT:-1800}" bash -c "${COMMANDS[$i]}" >"$log" 2>&1
  rc=$?
  ok=$([ $rc -eq 0 ] && echo 1 || echo 0)
  note="exit $rc"
  if [ "$ok" = 1 ] && [[ "$name" != logprobs-* ]] && ! grep -q "run stopped:" "$log"; then
    ok=0; note="exit 0 but no 'run stopped:' line"
  fi
  if [ "$ok" = 1 ] && [ "$name" = grpo-vllm ]; then
    vllm_diff >>"$log" 2>&1 || { ok=0; note="sampler log-prob difference missing, non-finite or >= 0.5"; }
  fi
  seconds=$(( $(date +%s) - start ))
  if [ "$ok" = 1 ]; then
    PASSED+=("$name")
    detail="$(grep -E '^run stopped:|^ok ' "$log" | tr '\n' ' ')"
    echo "PASS $name (${seconds}s) ${detail}"
  else
    FAILED+=("$name")
    echo "FAIL $name (${seconds}s, $note; log: $log)"
    tail -n 15 "$log" | sed 's/^/    /'
  fi
done

echo "gpu_check summary: ${#PASSED[@]} passed, ${#FAILED[@]} failed${FAILED:+ (${FAILED[*]})}; logs in $WORK/logs"
[ ${#FAILED[@]} -eq 0 ]
