#!/usr/bin/env bash
# Every check that needs a GPU, in one go, each bounded, one log per check in LOGS (default ./gpu_logs);
# CHECKS names a subset, e.g. CHECKS="gpu_smoke".
#
#     bash benchmarks/gpu_checks.sh [LOGS]
#
# Why one script: GPU time is lent in short slices, so the checks run back to back, each under its own
# `timeout`, and a check that fails or runs long leaves the later ones their turn. Run from the
# repository root with rl-bridges installed (`pip install -e .`; vLLM optional). The last line of each
# log is its `key=value` figure line; this script prints them together at the end.
#   0. benchmarks/logprob_probe.py: whether the chunked logprob path holds in fp32 and bf16 here;
#   1. the main job (`python -m bridges.train`, device=auto: the GPU), its wall time and final reward;
#   2. benchmarks/gpu_smoke.py: Qwen2.5-0.5B and 1.5B architectures, 3 bf16 steps each;
#   3. benchmarks/trainer_memory.py: the optimizer step's peak against its floor, all layers.
set -u
LOGS=${1:-gpu_logs}
mkdir -p "$LOGS"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

check() {  # check NAME SECONDS COMMAND...: run bounded, log, keep going
    local name=$1 seconds=$2
    shift 2
    local start=$SECONDS
    timeout -k 10 "$seconds" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    echo "check=$name rc=$rc wall_s=$((SECONDS - start))" | tee -a "$LOGS/summary.txt"
}

nvidia-smi -L >"$LOGS/device.txt" 2>&1
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" >>"$LOGS/device.txt" 2>&1
cat "$LOGS/device.txt"
RUNS=${RUNS:-$(mktemp -d)}  # the run folders stay out of LOGS: only the logs need to come back
# -P: the repository root is not put on sys.path, so `bridges` comes from the installed package
for name in ${CHECKS:-logprob_probe main_job gpu_smoke trainer_memory}; do
    case $name in
        logprob_probe) check logprob_probe "${PROBE_S:-60}" "$PY" benchmarks/logprob_probe.py ;;
        main_job) check main_job "${MAIN_S:-120}" "$PY" -P -m bridges.train output_dir="$RUNS" progress=false ;;
        gpu_smoke) check gpu_smoke "${SMOKE_S:-180}" "$PY" benchmarks/gpu_smoke.py ;;
        trainer_memory) check trainer_memory "${MEMORY_S:-90}" "$PY" benchmarks/trainer_memory.py ;;
        *) echo "unknown check $name" ;;
    esac
    echo "--- $name"
    tail -n 3 "$LOGS/$name.log"
done
