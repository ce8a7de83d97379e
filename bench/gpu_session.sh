#!/usr/bin/env bash
# Issue 19's GPU figures, in three parts that each fit one device call (10 minutes) and the whole
# in one lease (30 minutes of device time: call the parts back to back so the machine, and
# Inductor's compile cache in /tmp, stay warm). Each row is one process with its own timeout, so a
# row that hangs or runs out of memory costs its row, not the part.
#
#   here, once:   bash bench/gpu_wheels.sh                       # .whl/: bitsandbytes, torchao
#   on the GPU:   bash bench/gpu_session.sh stall                # tests/gpu + checkpoint stall, ~7 min
#                 bash bench/gpu_session.sh rest                 # 8-bit AdamW, float8, max-autotune
#                 bash bench/gpu_session.sh attention            # SDPA backends, flex (FA4), FA3, loss chunk
#                 bash bench/gpu_session.sh train                # issue 32: gristmill train e2e + float8
#                 bash bench/gpu_session.sh muon                 # issue 32: Muon vs AdamW, 200 steps
#                 bash bench/gpu_session.sh lent                 # train + rewind + merge + muon + init_from
#                                                                # in one call (E2E_STEPS=80): a 15-minute lease
#   (device tool: carry [".whl"]; what lands in $OUT comes back: PART.log and PART.json)
#   attention's FlashAttention 4 row: `bash bench/gpu_flash4.sh fetch` here; the call before it carries
#   [".whl", ".fa4a"] and starts `cp -r .fa4a /tmp/fa4a;`, the attention call carries [".fa4b"]
#   on CPU:       GPU_SESSION_SMOKE=1 PYTHON=.venv/bin/python bash bench/gpu_session.sh stall
#                 (the tiny preset on CPU: checks the script end to end; CUDA-only rows refuse in a line)
#
# Order of importance if the lease runs short: stall (the issue's goal), then rest (8-bit AdamW
# is asked for by name), then attention.
set -uo pipefail
part=${1:-}
case $part in stall | rest | attention | train | muon | rewind | lent) ;; *) echo "usage: bash bench/gpu_session.sh stall|rest|attention|train|muon|rewind|lent" >&2; exit 2 ;; esac
PY=${PYTHON:-python3}
OUT=${OUT:-runs/gpu-session}
mkdir -p "$OUT"
rows=$(mktemp -d)
log="$OUT/$part.log"
export PYTHONUNBUFFERED=1

if ls .whl/*.whl >/dev/null 2>&1; then  # the device image has neither; --target keeps its torch untouched
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

if [ -n "${GPU_SESSION_SMOKE:-}" ]; then
  MODEL="--preset tiny --device cpu --seq 128"
  STALL="--preset tiny --device cpu --saves 3"
  MFU="--quick --no-peer"
  E2E="--smoke --steps 30 --dir /tmp/gristmill-e2e"
else
  MODEL=""  # the 1.24B Llama-3 shape, seq 2048, bf16: train_mfu's defaults
  STALL="--preset llama3-1b --device cuda --seq 2048 --batch 8 --saves 3"
  MFU="--quick --no-peer --micro-batch 16"
  E2E="--steps ${E2E_STEPS:-200} --dir /tmp/gristmill-e2e"  # the 1.24B recipe through gristmill train, mbs 16
fi

# The part's own deadline, under the call's 600 s: a row gets what is left of it at most, and a
# row that would start with under 30 s left is skipped with a line saying so.
BUDGET=${PART_BUDGET_S:-570}
n=0
row() {  # row SECONDS DESCRIPTION -- COMMAND...: one timed process, its output in the log
  local limit=$1 what=$2
  shift 3
  n=$((n + 1))
  local left=$((BUDGET - SECONDS))
  if [ "$left" -lt 30 ]; then
    echo "=== [$part $n] $what: skipped, ${left} s left of the part's ${BUDGET} s" | tee -a "$log"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== [$part $n] $what: $*" | tee -a "$log"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  echo "=== [$part $n] rc $rc in $((SECONDS - t0)) s$([ "$rc" = 124 ] && echo " (stopped at its ${limit} s limit)")" \
    | tee -a "$log"
  collect
}
mfu() {  # mfu SECONDS DESCRIPTION FLAGS...
  local limit=$1 what=$2
  shift 2
  row "$limit" "$what" -- "$PY" -m bench.train_mfu $MODEL $MFU "$@" --json "$rows/$(printf %02d $((n + 1))).json"
}
# One JSON per part, rewritten after every row (the device tool returns at most 8 files, and what
# is in $OUT comes back even when the call is stopped): {row file: that row's results}.
collect() {
  "$PY" - "$rows" "$OUT/$part.json" <<'EOF'
import json, pathlib, sys
rows = {p.stem: json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))}
pathlib.Path(sys.argv[2]).write_text(json.dumps(rows, indent=1) + "\n")
EOF
}

{ echo "# gristmill $(git rev-parse --short HEAD 2>/dev/null) part $part, $(date -u +%FT%TZ)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  "$PY" -c "import bitsandbytes, torchao; print('bitsandbytes', bitsandbytes.__version__, 'torchao', torchao.__version__)" 2>&1 | tail -1
} | tee "$log"

case $part in
  stall)
    row 200 "CUDA test suite (pinned staging: 3 async saves, FSDP2/NCCL)" -- \
      "$PY" -m pytest -q --confcutdir=tests/gpu tests/gpu
    row 360 "checkpoint stall, 1.24B (goal: <= 1 s per async save)" -- \
      "$PY" -m bench.checkpoint_stall $STALL --dir /tmp/gristmill-stall --json "$rows/stall.json"
    ;;
  rest)
    mfu 90 "baseline" --loss-chunk 8192
    if [ -n "${GPU_SESSION_SMOKE:-}" ]; then
      mfu 120 "fused AdamW vs 8-bit AdamW, loss after 200 steps" --optim adamw adamw8bit --loss-steps 200
    else
      mfu 180 "fused AdamW vs 8-bit AdamW, loss after 200 steps" \
        --micro-batch 8 --accum 1 --optim adamw adamw8bit --loss-steps 200
    fi
    mfu 100 "float8 linears (torchao; reported apart)" --float8
    mfu 240 "per-block compile, max-autotune-no-cudagraphs" --compile-mode max-autotune-no-cudagraphs
    ;;
  train)  # issue 32: the user's tokens/s vs the model-only step, and float8 through gristmill train
    row 330 "gristmill train, bf16, 200 steps, + model-only (goal: ratio >= 0.97)" -- \
      "$PY" -m bench.train_e2e $E2E --json "$rows/e2e-bf16.json"
    row 230 "gristmill train, model.float8, 200 steps (goal: >= 1.12x bf16, loss@200 within 1%)" -- \
      "$PY" -m bench.train_e2e $E2E --float8 --no-model-only --json "$rows/e2e-float8.json"
    ;;
  muon)  # issue 32: Muon against AdamW through gristmill train, the same tokens (run after `train`)
    row 230 "gristmill train, AdamW, 200 steps" -- \
      "$PY" -m bench.train_e2e $E2E --no-model-only --json "$rows/e2e-adamw.json"
    row 230 "gristmill train, optim.name = muon, 200 steps" -- \
      "$PY" -m bench.train_e2e $E2E --optim muon --no-model-only --json "$rows/e2e-muon.json"
    ;;
  rewind)  # issue 31: what reading every step's loss costs (run.on_spike = rewind vs report, no spike)
    row 230 "gristmill train, on_spike = report, 200 steps" -- \
      "$PY" -m bench.train_e2e $E2E --no-model-only --json "$rows/e2e-report.json"
    row 230 "gristmill train, on_spike = rewind, 200 steps (goal: >= 0.99x report)" -- \
      "$PY" -m bench.train_e2e $E2E --no-model-only --set run.on_spike=rewind --label rewind \
      --json "$rows/e2e-rewind.json"
    ;;
  lent)  # what a 15-minute lease can hold, most wanted first: each run's steps after 20 are measured,
    # and the bf16 row is the baseline of float8, rewind (on_spike defaults to report) and muon
    row 200 "gristmill train, bf16 + model-only (goal: ratio >= 0.97)" -- \
      "$PY" -m bench.train_e2e $E2E --json "$rows/e2e-bf16.json"
    row 120 "gristmill train, model.float8 (goal: >= 1.12x bf16)" -- \
      "$PY" -m bench.train_e2e $E2E --float8 --no-model-only --json "$rows/e2e-float8.json"
    row 110 "gristmill train, on_spike = rewind (goal: >= 0.99x bf16's report)" -- \
      "$PY" -m bench.train_e2e $E2E --no-model-only --set run.on_spike=rewind --label rewind \
      --json "$rows/e2e-rewind.json"
    # issue 46: an EMA folds the weights in after every step (a foreach lerp over the fp32 shard), the
    # most [merge] costs a step; the Muon row (measured 2026-11-27) comes after it, with what is left
    # 150 s: on 2026-11-29 its run took 105 s (the last step's save with the EMA copy: 42 s), and the
    # bench's JSON came after the row's 110 s limit
    row 150 "gristmill train, [merge] ema (goal: >= 0.99x bf16)" -- \
      "$PY" -m bench.train_e2e $E2E --no-model-only --set merge.kind=ema merge.every=40 merge.decay=0.999 \
      --label merge --json "$rows/e2e-merge.json"
    # the init_from load is host-only (CPU, disk): it shares the host with the muon row, not the GPU
    # bounded by what is left of the part: the `wait` below must not carry the call past its limit
    # (2026-11-30: muon skipped at PART_BUDGET_S=450, the wait for this held the call to its 560 s)
    t=$((BUDGET - SECONDS)); t=$((t > 240 ? 240 : t < 30 ? 30 : t))
    timeout "$t" "$PY" -m bench.init_from_load --shape 1b >"$OUT/init_from.log" 2>&1 &
    row 120 "gristmill train, optim.name = muon" -- \
      "$PY" -m bench.train_e2e $E2E --optim muon --no-model-only --json "$rows/e2e-muon.json"
    wait
    ;;
  attention)
    mfu 110 "baseline (torch's SDPA choice)"
    # the document mask (docs ~900 tokens) through FlexAttention: Triton, then FlashAttention 4's
    # CuTe kernels (BACKEND "FLASH"), carried in two calls (bench/gpu_flash4.sh)
    mfu 100 "document mask, FlexAttention (Triton)" --attention flex
    if fa4=$(PYTHON=$PY bash bench/gpu_flash4.sh install 2>>"$log"); then
      echo "FlashAttention 4 installed: PYTHONPATH += $fa4" | tee -a "$log"
      export PYTHONPATH=$fa4${PYTHONPATH:+:$PYTHONPATH}
    fi
    mfu 150 "document mask, FlexAttention BACKEND FLASH (FlashAttention 4)" --attention flex-flash
    mfu 80 "cuDNN attention" --attention cudnn
    mfu 80 "FlashAttention 2 (torch's flash backend)" --attention flash
    mfu 80 "FlashAttention 3 (needs flash_attn_interface)" --attention fa3
    mfu 80 "memory-efficient SDPA" --attention efficient
    for c in 4096 16384 32768; do mfu 70 "loss chunk $c" --loss-chunk "$c"; done
    ;;
esac

echo "$n rows; results in $OUT/$part.log and $OUT/$part.json"
