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
#   3. benchmarks/trainer_memory.py: the optimizer step's peak against its floor, all layers;
#   4. benchmarks/generation_memory.py: one generation batch (64 rows, max_tokens 128/256/512) at
#      Qwen2.5-0.5B's width, all layers, against weights + KV cache (goal gen_peak_floor_ratio <= 1.3);
#      gpu_smoke's peak_over_resting is a train step's peak over its resting memory (goal <= 1.5);
#   5. fsdp_resume: trainer.strategy=fsdp in bf16 through a save at step 2 and a resume to step 4 (one
#      GPU: one process, so FSDP's sharding is a no-op and the bf16 checkpoint path is what runs);
#   6. vllm_engine: the main job with engine=vllm, when vLLM imports (skipped otherwise);
#   8. paged_engine: benchmarks/paged_engine.py at Qwen2.5-0.5B, all layers: the paged engine's generation
#      tokens/s against the hf engine's on one burst of 128 requests of 32-256 tokens (goal ratio >= 5);
#   9. gpu_vs_trl: benchmarks/gpu_vs_trl.py, our trainer and TRL's GRPOTrainer at Qwen2.5-0.5B and 1.5B
#      (goals: ratio >= 1.5, MFU >= 0.40 at 1.5B);
#   7. verl_backend / trl_backend: the main job's task on backend=verl (when verl imports) and backend=trl,
#      a few steps each, wall time and reward beside the bundled trainer's main_job (verl without vLLM:
#      the hf rollout, its weights synced through a CUDA IPC buffer on the worker's GPU).
# The defaults below sum to 1,050 s of timeouts, more than one lent slice: CHECKS picks the ones a
# slice is for, e.g. CHECKS="paged_engine gpu_vs_trl main_job" (540 s).
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
fsdp_resume() {  # save at step 2, stop at 4; resume to 6 from the newest checkpoint
    "$PY" -P -m bridges.train output_dir="$RUNS/fsdp" progress=false trainer.strategy=fsdp trainer.dtype=bf16 \
        trainer.max_steps=4 save_every=2 &&
    "$PY" -P -m bridges.train output_dir="$RUNS/fsdp" progress=false trainer.strategy=fsdp trainer.dtype=bf16 \
        trainer.max_steps=6 save_every=2 resume=true && echo "fsdp_resume=ok"
}
vllm_engine() {
    if ! "$PY" -c "import vllm" 2>/dev/null; then echo "vllm_engine=skipped (vllm does not import)"; return 0; fi
    "$PY" -P -m bridges.train output_dir="$RUNS/vllm" progress=false engine=vllm trainer.max_steps=40 &&
        echo "vllm_engine=ok"
}
other_backend() {  # other_backend NAME STEPS: the default task on another backend, a few steps
    if [ "$1" = verl ] && ! "$PY" -c "import verl" 2>/dev/null; then echo "verl_backend=skipped (verl does not import)"; return 0; fi
    "$PY" -P -m bridges.train output_dir="$RUNS/$1" progress=false backend="$1" trainer.max_steps="$2" &&
        echo "${1}_backend=ok"
}
export -f fsdp_resume vllm_engine other_backend  # `timeout` runs them through bash -c
export PY RUNS
for name in ${CHECKS:-paged_engine gpu_vs_trl logprob_probe main_job gpu_smoke trainer_memory generation_memory fsdp_resume vllm_engine verl_backend trl_backend}; do
    case $name in
        logprob_probe) check logprob_probe "${PROBE_S:-40}" "$PY" benchmarks/logprob_probe.py ;;
        main_job) check main_job "${MAIN_S:-80}" "$PY" -P -m bridges.train output_dir="$RUNS" progress=false ;;
        gpu_smoke) check gpu_smoke "${SMOKE_S:-120}" "$PY" benchmarks/gpu_smoke.py ;;
        trainer_memory) check trainer_memory "${MEMORY_S:-60}" "$PY" benchmarks/trainer_memory.py ;;
        generation_memory) check generation_memory "${GENERATION_S:-60}" "$PY" benchmarks/generation_memory.py ;;
        fsdp_resume) check fsdp_resume "${FSDP_S:-60}" bash -c fsdp_resume ;;
        vllm_engine) check vllm_engine "${VLLM_S:-60}" bash -c vllm_engine ;;
        verl_backend) check verl_backend "${VERL_S:-90}" bash -c "other_backend verl 5" ;;
        trl_backend) check trl_backend "${TRL_S:-60}" bash -c "other_backend trl 20" ;;
        paged_engine) check paged_engine "${PAGED_S:-120}" "$PY" benchmarks/paged_engine.py --layers 0 --requests 128 \
            --min-tokens 32 --max-tokens 256 --repeats 2 ;;
        gpu_vs_trl) check gpu_vs_trl "${VS_TRL_S:-300}" "$PY" benchmarks/gpu_vs_trl.py ;;
        *) echo "unknown check $name" ;;
    esac
    echo "--- $name"
    tail -n 3 "$LOGS/$name.log"
done
