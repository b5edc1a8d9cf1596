#!/usr/bin/env bash
# radixrt GPU checks in one run (at most 6 minutes with the install and FlashInfer's JIT warm-up).
# On the lent H200: the device tool runs `bash tests/gpu/run_gpu_checks.sh` with carry [".whl"].
# Rehearsal on a CPU machine: PYTHON=.venv/bin/python bash tests/gpu/run_gpu_checks.sh
# See tests/gpu/README.md for preparing .whl/.
set -u
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
T0=$(date +%s)
if ls .whl/*.whl >/dev/null 2>&1 && $PY -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  echo "NOTICE: no .whl/ wheels for this Python ($($PY -V 2>&1)); using the installed packages"
  export PYTHONPATH=$PWD
fi
echo "[$(( $(date +%s) - T0 ))s] wheels installed"
if [ -z "${CUDA_HOME:-}" ] && ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDA_HOME=/usr/local/cuda
fi
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
command -v nvcc >/dev/null 2>&1 && nvcc --version | tail -1
export MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export GPU_CHECKS_BUDGET_S=${GPU_CHECKS_BUDGET_S:-$(( 330 - ($(date +%s) - T0) ))}
timeout $(( 355 - ($(date +%s) - T0) )) $PY tests/gpu/gpu_checks.py "$@"
rc=$?
[ $rc -eq 124 ] && echo "TIMEOUT: gpu_checks.py was stopped at the 6-minute limit"
if [ -n "${OUT:-}" ] && [ -f benchmarks/results/gpu_checks.json ]; then
  cp benchmarks/results/gpu_checks.json "$OUT/"
fi
echo "[$(( $(date +%s) - T0 ))s] done, exit $rc"
exit $rc
