#!/usr/bin/env bash
# nnkit on a GPU in one prepared run (docs/gpu.md, "Commands to run on a GPU machine"): each part
# under its own time limit, its whole log in $OUT/<part>.log, one line per part in
# $OUT/summary.txt. About 5 minutes on one GPU with 16 CPU cores, at most 590 s (the sum of
# the limits and 10 s of grace each: it fits a 10-minute command); nothing is installed.
#
#   OUT=/some/folder bash tests/gpu/run.sh        # OUT defaults to ./gpu-run
#
# Parts: the machine (versions, what CuPy and PyTorch see); the GPU tests and the every-op CuPy
# table (-rs: every skip says why); the transfer test, verbose; the whole suite in parallel shards
# (-x off: every failure is listed); W7, the benchmarks on the GPU (W1's per-op cost, W2, W3, W4
# and W8 against hand-written CuPy and PyTorch CUDA).
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-gpu-run}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
PYTEST=("$PY" -m pytest -p no:cacheprovider -W ignore::DeprecationWarning)

part() {        # part NAME SECONDS COMMAND...: COMMAND's output in $OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    [ $rc -eq 124 ] && echo "(stopped after $limit s)" >> "$OUT/$name.log"
    printf '%-18s rc %-3s %4s s  %s\n' "$name" "$rc" "$((SECONDS - start))" \
        "$(tail -n 1 "$OUT/$name.log")" >> "$OUT/summary.txt"
}

: > "$OUT/summary.txt"
part machine 30 bash -c "nvidia-smi; $PY - <<'EOF'
import platform, numpy
print('Python', platform.python_version(), 'NumPy', numpy.__version__)
try:
    import cupy
    print('CuPy', cupy.__version__, 'devices', cupy.cuda.runtime.getDeviceCount())
except Exception as failure:
    print('CuPy:', type(failure).__name__, failure)
try:
    import torch
    print('PyTorch', torch.__version__, 'CUDA', torch.cuda.is_available())
except Exception as failure:
    print('PyTorch:', type(failure).__name__, failure)
import nnkit
print('nnkit.gpu_available()', nnkit.gpu_available())
EOF"
part gpu-tests 170 "${PYTEST[@]}" -q -rs tests/gpu tests/ops/test_every_op.py
part transfers 60 "${PYTEST[@]}" -v -rs tests/gpu/test_transfers.py

# the rest of the suite, in shards side by side (two BLAS threads each)
export OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
shards=(
    "tests/ops --ignore=tests/ops/test_every_op.py"
    "tests/replay"
    "tests/training tests/optim tests/data"
    "tests/layers tests/nets tests/io"
    "tests/course tests/examples tests/distributed tests/reliability"
    "tests/test_*.py"
)
for index in "${!shards[@]}"; do
    # shellcheck disable=SC2086  (a shard is several arguments)
    part "suite-$index" 180 "${PYTEST[@]}" -q -rs ${shards[$index]} &
done
wait
unset OPENBLAS_NUM_THREADS OMP_NUM_THREADS MKL_NUM_THREADS

part benchmarks 100 "$PY" -m benchmarks --only W7 --clock wall --rounds 5
cat "$OUT/summary.txt"
