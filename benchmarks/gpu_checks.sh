#!/usr/bin/env bash
# Every check that needs a GPU, in one go on a bare lent machine, each bounded, one log per check in LOGS
# (default ./gpu_logs); the default set ends in 8 minutes, most important first.
#
#     bash benchmarks/gpu_checks.sh --fetch-wheels   # here, once: the wheels the device image lacks, into .whl/
#     bash benchmarks/gpu_checks.sh [LOGS]           # there, from the repository root, .whl/ carried along
#
# Why one script: GPU time is lent in short slices (15 minutes, a machine start included), so the checks run
# back to back, each under its own `timeout`, and a check that fails or runs long leaves the later ones their
# turn. The last line of each log is its `key=value` figure line; this script prints them together at the end.
#
# 0. install (INSTALL_S, 60 s): the wheels in .whl/ that the device image lacks (benchmarks/gpu_wheels.txt:
#    rl-bridges' own dependencies and TRL, ~8 MB; the image has torch 2.11, transformers 5.17, peft,
#    accelerate, pyarrow) and this working tree, all with --no-deps into one folder on PYTHONPATH. SKIP_INSTALL=1
#    when everything is installed already.
# The default CHECKS, 420 s of timeouts:
# 1. decode_probe (DECODE_S, 150 s): benchmarks/decode_probe.py at Qwen2.5-0.5B, 64 and 256 rows x 256 tokens:
#    the hf engine with CUDA graphs, model.generate as TRL calls it, the eager loop, the paged engine with
#    graphs; ms per step, tokens/s, peak, host syncs (goal >= 10,000 tokens/s at 64 rows);
# 2. gpu_vs_trl_05b (VS_TRL_S, 150 s): benchmarks/gpu_vs_trl.py at Qwen2.5-0.5B, 3 steps of 8 x 8 x 256: ours one
#    batch ahead and synchronous, TRL fp32 weights + bf16 autocast and pure bf16 (goal ratio >= 1.5);
# 3. gpu_vs_trl_15b (VS_TRL_15_S, 120 s): the same at Qwen2.5-1.5B, ours one batch ahead against TRL as its
#    users run it (goals: ratio >= 1.5, training MFU >= 0.40 of the card's bf16 peak).
# Further checks, by name in CHECKS: logprob_probe, main_job, gpu_smoke, trainer_memory, generation_memory,
# fsdp_resume, vllm_engine (needs a vLLM wheel in .whl/), paged_engine, verl_backend, trl_backend.
set -u
PY=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = "--fetch-wheels" ]; then  # here: Python 3.12 x86-64 wheels for the device, into .whl/
    mkdir -p "$ROOT/.whl"
    grep -v '^#' "$ROOT/benchmarks/gpu_wheels.txt" | grep -v antlr4 | xargs "$PY" -m pip download -q --no-deps \
        --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$ROOT/.whl"
    # antlr4's runtime (omegaconf's parser) is published as a source archive only: built there
    "$PY" -m pip download -q --no-deps --no-binary=:all: "$(grep '^antlr4' "$ROOT/benchmarks/gpu_wheels.txt")" -d "$ROOT/.whl"
    du -sh "$ROOT/.whl"
    exit 0
fi
LOGS=${1:-gpu_logs}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error

check() {  # check NAME SECONDS COMMAND...: run bounded, log, keep going
    local name=$1 seconds=$2
    shift 2
    local start=$SECONDS
    timeout -k 10 "$seconds" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    echo "check=$name rc=$rc wall_s=$((SECONDS - start))" | tee -a "$LOGS/summary.txt"
}

install() {  # the wheels the image lacks and this tree, --no-deps, into SITE (on PYTHONPATH from here on)
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$SITE" "$ROOT"/.whl/* &&
        "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$SITE" "$ROOT" &&
        PYTHONPATH="$SITE" "$PY" -P -c "import bridges.train, trl, datasets, omegaconf, fastapi; print('install=ok')"
}
SITE=${SITE:-/tmp/bridges_site}
export -f install
export PY ROOT SITE
nvidia-smi -L >"$LOGS/device.txt" 2>&1
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" >>"$LOGS/device.txt" 2>&1
cat "$LOGS/device.txt"
if [ "${SKIP_INSTALL:-0}" != 1 ]; then
    check install "${INSTALL_S:-60}" bash -c install
    tail -n 2 "$LOGS/install.log"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
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
export RUNS
B="$ROOT/benchmarks"
for name in ${CHECKS:-decode_probe gpu_vs_trl_05b gpu_vs_trl_15b}; do
    case $name in
        decode_probe) check decode_probe "${DECODE_S:-150}" "$PY" "$B/decode_probe.py" --rows 64,256 \
            --paths hf_graphs,hf_generate,hf_eager,paged_graphs ;;
        gpu_vs_trl_05b) check gpu_vs_trl_05b "${VS_TRL_S:-150}" "$PY" "$B/gpu_vs_trl.py" --arch qwen2.5-0.5b --steps 3 ;;
        gpu_vs_trl_15b) check gpu_vs_trl_15b "${VS_TRL_15_S:-120}" "$PY" "$B/gpu_vs_trl.py" --arch qwen2.5-1.5b \
            --steps 3 --rows ours_ahead1,trl_amp ;;
        logprob_probe) check logprob_probe "${PROBE_S:-40}" "$PY" "$B/logprob_probe.py" ;;
        main_job) check main_job "${MAIN_S:-80}" "$PY" -P -m bridges.train output_dir="$RUNS" progress=false ;;
        gpu_smoke) check gpu_smoke "${SMOKE_S:-120}" "$PY" "$B/gpu_smoke.py" ;;
        trainer_memory) check trainer_memory "${MEMORY_S:-60}" "$PY" "$B/trainer_memory.py" ;;
        generation_memory) check generation_memory "${GENERATION_S:-60}" "$PY" "$B/generation_memory.py" ;;
        fsdp_resume) check fsdp_resume "${FSDP_S:-60}" bash -c fsdp_resume ;;
        vllm_engine) check vllm_engine "${VLLM_S:-60}" bash -c vllm_engine ;;
        verl_backend) check verl_backend "${VERL_S:-90}" bash -c "other_backend verl 5" ;;
        trl_backend) check trl_backend "${TRL_S:-60}" bash -c "other_backend trl 20" ;;
        paged_engine) check paged_engine "${PAGED_S:-120}" "$PY" "$B/paged_engine.py" --layers 0 --requests 128 \
            --min-tokens 32 --max-tokens 256 --repeats 2 --graphs ;;
        *) echo "unknown check $name" ;;
    esac
    echo "--- $name"
    tail -n 3 "$LOGS/$name.log"
done
echo "=== figures"
for log in "$LOGS"/*.log; do tail -n 1 "$log"; done
