#!/usr/bin/env bash
# One command for the GPU machine (docs/gpu.md): the environment, the GPU tests, the GPU and
# scaling benchmarks, the model benchmarks, every strategy for a few steps on CUDA (LeNet-5
# on Fashion-MNIST, and the GPT and CTR models where this checkout has them). Each step runs
# under its own time bound and a failed step does not stop the next; the whole finishes
# inside GPU_CHECK_BUDGET seconds (480).
#
#   bash tools/gpu_prepare.sh                  # where the data is: fills .gpu-data/
#   bash tools/gpu_check.sh                    # on the GPU machine (carry .gpu-data)
#   GPU_CHECK_DRY=1 bash tools/gpu_check.sh    # anywhere: every command and file checked,
#                                              # nothing trained or measured (no CUDA needed)
#
# Results in $OUT (default ./out/gpu-check), at most 8 files as the device tool brings back:
# SUMMARY.txt, steps.json, env.json, runs.json, benches.json, logs.tar.gz.
# Settings (environment): OUT; GPU_CHECK_DATA (the data folder, .gpu-data);
# GPU_CHECK_STEPS (comma list: run only these steps, e.g. runs-gpt,bench-gpt for a rerun;
# `scale`, the simulator against real runs at N up to 8, runs only when named here);
# GPU_CHECK_BUDGET (seconds in all, 480); PYTHON (python3).
set -u

if [ ! -f pyproject.toml ] || [ ! -f phalanx/cli.py ] || [ ! -f tools/gpu_runs.py ]; then
    echo "gpu_check: run it from the repository root (bash tools/gpu_check.sh); $PWD is not one" >&2
    exit 2
fi

# step -> its share of the budget in seconds (the shares of the steps that run are scaled
# to the budget less RESERVE); a step may also use what the steps before it left unused.
# From the first real run (H200, 16 cores, 2026-11-27; docs/gpu.md "Results"): measured
# nvidia-smi 0 s, env 9, data 0, bench-gpu 28, scaling-cuda 30; pytest 32 s for 8 of its 25
# tests (estimated 90); scaling-cpu 59 s up to N=15's last run (estimated 63); bench-gpt cut
# at 26 s after 1 of its 4 parts (estimated 60: 5 runs of ~10 s left); bench-ctr 11 s to
# its first run's end (estimated 30 for 3); the strategy runs 5-20 s each (170 s for
# LeNet-5's 13 one at a time), estimated 40, 47 and 35 s with RUN_JOBS at once. The
# strategy runs come last: an overrun skips single runs (each listed), not a benchmark.
ORDER=(nvidia-smi env data pytest bench-gpu scaling-cuda scaling-cpu bench-gpt bench-ctr
       runs-lenet5 runs-gpt runs-ctr scale)
declare -A SHARE=([nvidia-smi]=5 [env]=15 [data]=5 [pytest]=100 [bench-gpu]=35
                  [scaling-cuda]=35 [scaling-cpu]=65 [bench-gpt]=65 [bench-ctr]=30
                  [runs-lenet5]=35 [runs-gpt]=40 [runs-ctr]=35 [scale]=400)
# steps that run only when GPU_CHECK_STEPS names them: `scale` (tools/gpu_scale.py, the
# simulator against real runs at N up to 8 on test hosts, CPU only) takes minutes of its
# own: GPU_CHECK_STEPS=scale GPU_CHECK_BUDGET=480, in a call of its own
OPT_IN=(scale)
RESERVE=15  # the summary and packing the logs
# strategy runs at once (tools/gpu_runs.py --jobs): a run is a driver and 2-3 ranks, busy
# mostly with start-up (imports, CUDA init, rendezvous: 5-10 s of its 5-20 s); 6 at once
# keep about 9-12 of the 16 cores busy, and each uses well under 1 GiB of the GPU
RUN_JOBS=6
# the scaling benchmark on the CPU: N = 8 (issue 11's targets) and 15 (the cores, less one)
SCALING_CPU=(--device cpu --max-workers 15 --worker-counts 8,15)

DRY=${GPU_CHECK_DRY:-0}
OUT=${OUT:-./out/gpu-check}
DATA=${GPU_CHECK_DATA:-.gpu-data}
BUDGET=${GPU_CHECK_BUDGET:-480}
ONLY=${GPU_CHECK_STEPS:-}
PY=${PYTHON:-python3}

fail() { echo "gpu_check: $*" >&2; exit 2; }
case $DRY in 0 | 1) ;; *) fail "GPU_CHECK_DRY: '$DRY' is not 0 or 1" ;; esac
[[ $BUDGET =~ ^[0-9]+$ ]] && [ "$BUDGET" -ge $((RESERVE + 30)) ] ||
    fail "GPU_CHECK_BUDGET: '$BUDGET' is not a whole number of seconds >= $((RESERVE + 30))"
for s in ${ONLY//,/ }; do
    [[ -v SHARE[$s] ]] || fail "GPU_CHECK_STEPS: '$s' is not one of ${ORDER[*]}"
done
command -v "$PY" >/dev/null || fail "PYTHON: '$PY' is not a command here"
if [ "$DRY" = 0 ] && [ ! -d "$DATA" ]; then
    fail "$DATA: no such folder; fill it with 'bash tools/gpu_prepare.sh' where the data is and name it in the device tool's carry (docs/gpu.md)"
fi
mkdir -p "$OUT" 2>/dev/null || fail "OUT: cannot make the folder '$OUT'"
LOGS=$OUT/logs
rm -rf "$LOGS" "$OUT/logs.tar.gz" "$OUT/SUMMARY.txt" "$OUT/steps.json" "$OUT/env.json" \
    "$OUT/runs.json" "$OUT/benches.json"
mkdir -p "$LOGS"
TSV=$LOGS/steps.tsv  # a step's record; a step run at once with others (at_once) has its own
touch "$TSV"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
DRYARG=()
[ "$DRY" = 1 ] && DRYARG=(--dry)

selected() {
    if [[ " ${OPT_IN[*]} " == *" $1 "* ]]; then [[ ",$ONLY," == *",$1,"* ]]; return; fi
    [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]
}

# each selected step's deadline, in seconds since the start ($SECONDS)
declare -A END
total=0
for s in "${ORDER[@]}"; do selected "$s" && total=$((total + SHARE[$s])); done
acc=0
for s in "${ORDER[@]}"; do
    if selected "$s"; then acc=$((acc + SHARE[$s])); END[$s]=$((acc * (BUDGET - RESERVE) / total)); fi
done

record() {  # NAME STATUS RC SECONDS BOUND REASON
    local reason=${6//$'\t'/ }
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$reason" >>"$TSV"
    printf '[%4d s] %-13s %s%s\n' "$SECONDS" "$1" "$2" "${reason:+: $reason}"
}

skip() {  # NAME REASON
    if selected "$1"; then record "$1" skipped "" 0 0 "$2"
    elif [[ " ${OPT_IN[*]} " == *" $1 "* ]]; then
        record "$1" skipped "" 0 0 "opt-in: name it in GPU_CHECK_STEPS (minutes of its own)"
    else record "$1" skipped "" 0 0 "not in GPU_CHECK_STEPS"; fi
}

last_line() { grep -v '^[[:space:]]*$' "$1" | tail -n 1 | cut -c 1-300; }

step() {  # NAME COMMAND... : COMMAND under the step's bound, its output in logs/NAME.log
    local name=$1 bound rc t0 status reason=""
    shift
    if ! selected "$name"; then skip "$name" ""; return; fi
    bound=$((END[$name] - SECONDS))
    if [ "$bound" -lt 5 ]; then record "$name" skipped "" 0 0 "the $BUDGET s budget is spent"; return; fi
    echo "[$(printf '%4d' "$SECONDS") s] $name: started, bound $bound s"
    echo "\$ $*" >"$LOGS/$name.log"
    t0=$SECONDS
    timeout -k 10 "$bound" "$@" >>"$LOGS/$name.log" 2>&1
    rc=$?
    case $rc in
        0) status=ok ;;
        124 | 137) status=timeout reason="past its $bound s bound" ;;
        *) status=failed reason=$(last_line "$LOGS/$name.log") ;;
    esac
    if [[ ($name == runs-* || $name == scale) && $rc == 3 ]]; then  # not here: the model
        # (tools/gpu_runs.py), or test hosts (tools/gpu_scale.py)
        status=skipped reason=$(last_line "$LOGS/$name.log")
    fi
    record "$name" "$status" "$rc" "$((SECONDS - t0))" "$bound" "$reason"
}

bench() {  # NAME FILE ARGS... : the benchmark, or in a dry run its --help and flags
    local name=$1 file=$2
    shift 2
    if [ ! -f "$file" ]; then skip "$name" "$file does not exist in this checkout"; return; fi
    if [ "$DRY" = 1 ]; then
        step "$name" "$PY" tools/gpu_probe.py help-lists "$file" "$@"
    else
        step "$name" "$PY" "$file" "$@"
    fi
}

runs() {  # MODEL : every strategy a few steps on CUDA (checked only, in a dry run)
    local name=runs-$1 left
    if ! selected "$name"; then skip "$name" ""; return; fi
    left=$((END[$name] - SECONDS - 10))  # the runner writes its table before the bound
    [ "$left" -lt 5 ] && left=5
    step "$name" "$PY" tools/gpu_runs.py --model "$1" --data "$DATA" --out "$LOGS" \
        --budget "$left" --jobs "$RUN_JOBS" "${DRYARG[@]}"
}

# a dry run checks commands, it measures nothing: its steps from pytest on (each a Python
# that imports torch, ~2 s of CPU, and waits for little else; one at a time they were 30 s
# of the suite's time on 2 cores, 100 s under load) run at once, each into its own record
# and output, gathered in the script's order by `gather`. (The environment comes first,
# alone: a failure there explains the others, and its bound is the shortest.)
AT_ONCE=()
at_once() {  # FUNCTION KEY ARGS... : FUNCTION KEY ARGS..., in the background in a dry run
    if [ "$DRY" != 1 ]; then "$@"; return; fi
    ( TSV=$LOGS/.at-once-$2.tsv; : >"$TSV"; "$@" ) >"$LOGS/.at-once-$2.out" 2>&1 &
    AT_ONCE+=("$2")
}

gather() {  # sync point: every at_once step ended; their records and output in order
    local key
    wait
    for key in "${AT_ONCE[@]}"; do
        cat "$LOGS/.at-once-$key.tsv" >>"$LOGS/steps.tsv"
        cat "$LOGS/.at-once-$key.out"
        rm -f "$LOGS/.at-once-$key.tsv" "$LOGS/.at-once-$key.out"
    done
    AT_ONCE=()
}

finish() {
    trap - TERM INT
    gather
    local elapsed=$SECONDS bad=0
    awk -F'\t' '$2 == "failed" || $2 == "timeout" { bad = 1 } END { exit !bad }' \
        "$LOGS/steps.tsv" && bad=1
    if ! "$PY" tools/gpu_summary.py "$OUT" --budget "$BUDGET" --elapsed "$elapsed" \
        "${DRYARG[@]}" >"$LOGS/summary.log" 2>&1; then
        { echo "the summary failed (logs/summary.log); the steps:"; cat "$LOGS/steps.tsv"; } \
            >"$OUT/SUMMARY.txt"
        bad=1
    fi
    tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"
    echo
    cat "$OUT/SUMMARY.txt"
    return $bad
}
trap 'echo "gpu_check: stopped by a signal"; finish; exit 143' TERM INT

echo "gpu_check: $( [ "$DRY" = 1 ] && echo "dry run, " )budget $BUDGET s, data $DATA, results in $OUT"

# 1. the environment
if command -v nvidia-smi >/dev/null; then
    step nvidia-smi nvidia-smi
elif [ "$DRY" = 1 ]; then
    skip nvidia-smi "nvidia-smi not found (a dry run needs none)"
elif selected nvidia-smi; then
    record nvidia-smi failed 127 0 0 "nvidia-smi not found: is this the GPU machine?"
else
    skip nvidia-smi ""
fi
step env "$PY" tools/gpu_probe.py env "$OUT/env.json" "${DRYARG[@]}"
step data "$PY" tools/gpu_probe.py data "$DATA"

# 2. the GPU tests (pytest may be missing there: then the step says so)
gpu_tests() {  # NAME
    if ! selected "$1"; then
        skip "$1" ""
    elif ! "$PY" -c 'import pytest' 2>/dev/null; then
        skip "$1" "pytest is not installed for $PY (carry it as a wheel: docs/gpu.md)"
    elif [ "$DRY" = 1 ]; then
        step "$1" "$PY" -m pytest -p no:cacheprovider -m gpu tests/gpu -q --collect-only
    else
        step "$1" "$PY" -m pytest -p no:cacheprovider -m gpu tests/gpu -x -q -rs
    fi
}
at_once gpu_tests pytest

# 3-4. our loop against plain PyTorch on the GPU; scaling on the GPU and on the cores
at_once bench bench-gpu bench/gpu.py --quick
at_once bench scaling-cuda bench/scaling.py --device cuda --quick
at_once bench scaling-cpu bench/scaling.py "${SCALING_CPU[@]}"

# 5. the model benchmarks, where this checkout has them
at_once bench bench-gpt bench/gpt.py --device cuda --quick
at_once bench bench-ctr bench/ctr.py --device cuda --quick

# 6. every strategy of the registry for a few steps with --device cuda, RUN_JOBS at once
# (last: a step cut short skips single runs, each listed with its reason)
at_once runs lenet5
at_once runs gpt
at_once runs ctr

# 7. opt-in (GPU_CHECK_STEPS=scale): the scale simulator against real runs at N up to 8,
# every process on a core of its own (tools/gpu_scale.py; its tables in logs/)
scale_check() {
    if ! selected scale; then skip scale ""; return; fi
    step scale "$PY" tools/gpu_scale.py "$LOGS" "${DRYARG[@]}"
}
at_once scale_check scale

finish
