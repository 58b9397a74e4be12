#!/usr/bin/env bash
# One command on an offline GPU machine: install abl from the prepared wheels and the tree,
# run abl selftest, the norms and precision grids over both kernel backends, and a >= 100M
# parameter bf16 cell. Everything lands in one folder ($OUT if set), at most 8 files:
#   env.txt         device, driver, versions (nvidia-smi, python, pip's view of the key packages)
#   selftest.json   the selftest report (abl selftest --json)
#   selftest.txt    its tables and progress, as a terminal shows them
#   grids.txt       the norms and precision grids' summaries, train.kernels = triton and torch
#   big.txt         the >= 100M-parameter bf16 cell (scripts/gpu_big.toml)
#   packing.txt     stage packing (not run by default): the flagship norms grid packed (cells per GPU
#                   chosen from their predicted memory) and serial (--cells-per-gpu 1), each in a fresh
#                   store under its own limit: their "whole grid done:" lines (wall time, training-step
#                   time, busy share) and nvidia-smi's mean utilisation during each (issue 37); on a GPU
#                   a third run, cold: packed with --warm-workers off (a process per cell, not warm workers)
#   seeds.txt       stage seeds (not run by default): abl bench seeds on the flagship's cell, 4 seeds trained
#                   apart, one process each and stacked as one vmapped model, train.kernels = torch and auto
#                   (issue 37, item 4: whether stacking seeds pays on a GPU)
#   ladder.txt      stage ladder (not run by default): scripts/gpu_ladder.toml, GELU and SwiGLU at three sizes
#                   with cells packed on the GPU, then abl ladder's verdicts along the sizes (issue 41)
#   abl.duckdb      the store: selftest rows, kernel bench rows, every run's metrics
#   status.txt      each stage's exit status and wall time
#
# Usage: bash scripts/gpu_run.sh [STAGE...]    STAGE: selftest, grids (= norms precision), big, packing, seeds,
#        ladder
#        (default: selftest grids big)
#        bash scripts/gpu_run.sh probe         the GPU probe alone (python -m abl.bench.probe; docs/gpu.md,
#        "The probe"): seven stages, each under its own time limit (abl.bench.probe.LIMITS, 495 s in
#        all), each writing its own probe-<letter>-<stage>.txt; status.txt holds the environment and
#        each stage's exit status and wall time: 8 files
# Environment:
#   OUT                   output folder (default ./gpu-out)
#   ABL_GPU_WHEELS        the folder scripts/gpu_prepare.sh filled (default .gpu-wheels)
#   ABL_GPU_PYTHON        the interpreter (default python3)
#   ABL_GPU_INSTALL=0     use the interpreter's abl as it is (no install; the CPU test does this)
#   ABL_GPU_SELFTEST_ARGS more options for abl selftest (e.g. --quick, if the full one outruns a call)
#   ABL_GPU_STAGE_TIMEOUT seconds each stage may run before it is stopped (default 0: no limit); a
#                         stopped stage is recorded in status.txt (exit 124) and the next one runs
#   ABL_GPU_PACKING_TIMEOUT seconds each of the packing stage's runs may take (default 240)
#   ABL_GPU_PACKING_MODES   the packing stage's runs, of packed serial cold (default: all three where
#                           nvidia-smi is, else packed serial)
#   ABL_GPU_LADDER_TIMEOUT  seconds the ladder stage's grid may take (default 300); abl ladder then reads
#                           what it stored
#   ABL_GPU_TINY=1        tiny sizes (the CPU test): selftest --quick, one cell of each grid
#                         with a few steps, the big cell shrunk
set -uo pipefail

# the whole script is one function, parsed before it runs: editing the file mid-run cannot derail it
main() {
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/gpu-out}
WHEELS=${ABL_GPU_WHEELS:-$ROOT/.gpu-wheels}
PY=${ABL_GPU_PYTHON:-python3}
TINY=${ABL_GPU_TINY:-0}
# GNU timeout: 0 means no limit; -k: a stage that ignores SIGTERM is killed 10 s later
LIMIT=(timeout -k 10 "${ABL_GPU_STAGE_TIMEOUT:-0}")
WORK=$(mktemp -d -t abl-gpu.XXXXXX)
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(selftest grids big)
for s in "${STAGES[@]}"; do
    case $s in selftest|grids|norms|precision|big|packing|seeds|ladder) ;;
        probe) [ ${#STAGES[@]} -eq 1 ] || {
            echo "error: probe runs alone (its 8 files are all a call brings back)" >&2; exit 2; } ;;
        *) echo "error: unknown stage '$s' (selftest, grids, norms, precision, big, packing, seeds, ladder, probe)" >&2
           exit 2;; esac
done
mkdir -p "$OUT"
DB=$WORK/abl.duckdb
export PYTHONUNBUFFERED=1 ABL_CACHE_DIR=$WORK/cache
status() { echo "$*" | tee -a "$OUT/status.txt"; }

if [ "${ABL_GPU_INSTALL:-1}" != 0 ]; then
    SITE=$WORK/site
    wheels=("$WHEELS"/*.whl)
    if [ ! -e "${wheels[0]}" ]; then
        echo "error: no wheels in $WHEELS; run scripts/gpu_prepare.sh first (docs/gpu.md)" >&2
        exit 2
    fi
    # --target: beside the image's packages, which stay as they are (torch, triton, ...)
    "$PY" -m pip install -q --no-deps --no-index --no-compile --target "$SITE" "${wheels[@]}" || exit 2
    "$PY" -m pip install -q --no-deps --no-index --no-build-isolation --no-compile --target "$SITE" "$ROOT" \
        || exit 2
    rm -rf "$ROOT/build"
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
ABL=("$PY" -m abl.cli)

ENV_FILE=$OUT/env.txt
[ "${STAGES[0]}" = probe ] && ENV_FILE=$OUT/status.txt  # the probe's 7 files and this one: 8
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"; echo "stages: ${STAGES[*]}  tiny: $TINY"
    command -v nvidia-smi >/dev/null && nvidia-smi
    "$PY" -c 'import platform, torch; print("python", platform.python_version(), "| torch", torch.__version__,
"| cuda", torch.version.cuda, "| gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")'
    "$PY" -m pip list 2>/dev/null | grep -iE '^(abl|torch|triton|duckdb|liger|fla|flash|mamba|numpy) ' || true
} > "$ENV_FILE" 2>&1

run_stage() {  # run_stage NAME LOGFILE COMMAND...: one stage, its status and wall time in status.txt
    local name=$1 log=$2; shift 2
    local t0=$SECONDS rc
    "${LIMIT[@]}" "$@" >> "$log" 2>&1
    rc=$?
    status "$name: exit $rc in $((SECONDS - t0)) s"
}

for stage in "${STAGES[@]}"; do
    case $stage in
    selftest)
        quick=(${ABL_GPU_SELFTEST_ARGS:-}); [ "$TINY" = 1 ] && quick+=(--quick)
        t0=$SECONDS
        "${LIMIT[@]}" "${ABL[@]}" selftest "${quick[@]}" --json --db "$DB" > "$OUT/selftest.json" 2> "$OUT/selftest.txt"
        status "selftest: exit $? in $((SECONDS - t0)) s"
        ;;
    grids|norms|precision)
        grids=("$stage"); [ "$stage" = grids ] && grids=(norms precision)
        extra=()
        if [ "$TINY" = 1 ]; then
            extra=(--cells 1 --set 'experiment.seeds=[0]' --set train.steps=2 --set train.eval_every=2
                   --set train.eval_batches=1 --set train.batch_size=2 --set model.context=32
                   --set model.d_model=32 --set model.n_layers=1)
        fi
        for grid in "${grids[@]}"; do
            for kernels in triton torch; do
                echo "== abl run $grid, train.kernels = $kernels" >> "$OUT/grids.txt"
                run_stage "grid $grid kernels=$kernels" "$OUT/grids.txt" "${ABL[@]}" run "$grid" --db "$DB" \
                    --set "experiment.name=$grid-$kernels" --set "train.kernels=$kernels" "${extra[@]}"
            done
        done
        ;;
    probe)
        # each stage in its own process under its own limit; the stage stops itself GRACE_S sooner and
        # writes its file line by line, so a stage stopped here keeps what it measured
        limits=$("$PY" -c 'from abl.bench.probe import LIMITS, GRACE_S
for s, n in LIMITS.items(): print(s, n, n - GRACE_S)') || { status "probe: cannot read abl.bench.probe"; exit 1; }
        while read -r name limit budget; do
            t0=$SECONDS
            log=$WORK/probe-$name.log
            timeout -k 5 "$limit" "$PY" -m abl.bench.probe "$name" --out "$OUT" --seconds "$budget" \
                --cell "$ROOT/scripts/gpu_big.toml" > "$log" 2>&1
            rc=$?
            file=$(ls "$OUT"/probe-?-"$name".txt 2>/dev/null | head -1)
            [ -n "$file" ] || file=$OUT/probe-$name.txt
            if ! tail -1 "$file" 2>/dev/null | grep -qE '^(done|skipped|failed) in'; then
                { echo "--- the stage did not finish (exit $rc; 124: stopped at its $limit s limit); its last output:"
                  tail -30 "$log"; } >> "$file"
            fi
            status "probe $name: exit $rc in $((SECONDS - t0)) s (limit $limit s)"
        done <<< "$limits"
        ;;
    packing)
        # issue 37: the flagship grid with several cells per GPU and with one, each run whole in a fresh store;
        # abl run's "whole grid done:" line gives the wall time, the cells' training-step time and the busy share
        # (NVML where nvidia-ml-py is installed); nvidia-smi's own samples are averaged here beside it
        extra=()
        if [ "$TINY" = 1 ]; then
            extra=(--cells 1-2 --set 'experiment.seeds=[0]' --set train.steps=2 --set train.eval_every=2
                   --set train.eval_batches=1 --set train.batch_size=2 --set model.context=32
                   --set model.d_model=32 --set model.n_layers=1)
        fi
        # on a GPU a third run, packed with --warm-workers off (a process per cell, forked from the zygote),
        # measures what the warm workers (on by default on CUDA) save; on a CPU both are the zygote's
        modes="packed serial"
        command -v nvidia-smi >/dev/null && modes="packed serial cold"
        for mode in ${ABL_GPU_PACKING_MODES:-$modes}; do
            opts=(--speed-pass never); [ "$mode" = serial ] && opts+=(--cells-per-gpu 1)
            [ "$mode" = cold ] && opts+=(--warm-workers off)
            [ "$mode" = packed ] && [ "$TINY" = 1 ] && opts+=(--workers 2)  # the CPU test: two cells at once
            echo "== abl run norms, $mode (${opts[*]})" >> "$OUT/packing.txt"
            smi=
            if command -v nvidia-smi >/dev/null; then
                nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 500 \
                    > "$WORK/util-$mode.txt" 2>/dev/null &
                smi=$!
            fi
            t0=$SECONDS
            timeout -k 10 "${ABL_GPU_PACKING_TIMEOUT:-240}" "${ABL[@]}" run norms --db "$WORK/packing-$mode.duckdb" \
                --runs-dir "$WORK/packing-$mode-runs" "${opts[@]}" "${extra[@]}" >> "$OUT/packing.txt" 2>&1
            rc=$?
            if [ -n "$smi" ]; then
                kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
                awk -v m="$mode" '$1 ~ /^[0-9]+$/ {s += $1; n++}
                    END {if (n) printf "nvidia-smi: %s: GPU utilisation %.0f%% (mean of %d samples, every 0.5 s, all GPUs)\n",
                         m, s / n, n}' "$WORK/util-$mode.txt" >> "$OUT/packing.txt"
            fi
            status "packing $mode: exit $rc in $((SECONDS - t0)) s (limit ${ABL_GPU_PACKING_TIMEOUT:-240} s)"
        done
        ;;
    seeds)
        # issue 37, item 4: the flagship's cell (ablations/norms.toml: d_model 64, lr 1e-2), its seeds trained
        # apart, one process each, and stacked (torch.func vmap), on torch's kernels and on auto's
        cell=(--set model.d_model=64 --set train.lr=0.01 --set train.threads=1)
        n=4 steps=20
        if [ "$TINY" = 1 ]; then
            cell=(--set model.d_model=16 --set model.n_layers=1 --set model.context=16 --set train.batch_size=2)
            n=2 steps=1
        fi
        for kernels in torch auto; do
            echo "== abl bench seeds, train.kernels = $kernels" >> "$OUT/seeds.txt"
            run_stage "seeds kernels=$kernels" "$OUT/seeds.txt" "${ABL[@]}" bench seeds --seeds "$n" --steps "$steps" \
                "${cell[@]}" --set "train.kernels=$kernels"
        done
        ;;
    ladder)
        extra=()
        if [ "$TINY" = 1 ]; then  # the CPU test: one step per size, small batches
            extra=(--set ladder.tokens_per_param=0.0001 --set train.batch_size=2 --set model.context=32
                   --set train.eval_batches=1 --set train.warmup_steps=0 --set train.precision=fp32
                   --set train.device=cpu)
        fi
        t0=$SECONDS
        timeout -k 10 "${ABL_GPU_LADDER_TIMEOUT:-300}" "${ABL[@]}" run scripts/gpu_ladder.toml --db "$DB" \
            --speed-pass never "${extra[@]}" >> "$OUT/ladder.txt" 2>&1
        rc=$?
        status "ladder: exit $rc in $((SECONDS - t0)) s (limit ${ABL_GPU_LADDER_TIMEOUT:-300} s)"
        "${ABL[@]}" ladder scripts/gpu_ladder.toml --db "$DB" --at 1e18 "${extra[@]}" >> "$OUT/ladder.txt" 2>&1
        ;;
    big)
        extra=()
        if [ "$TINY" = 1 ]; then
            extra=(--set train.steps=2 --set train.eval_every=2 --set train.eval_batches=1 --set train.batch_size=2
                   --set model.context=32 --set model.d_model=32 --set model.n_layers=1 --set model.n_heads=2
                   --set train.compile=false --set train.precision=fp32 --set train.device=cpu)
        fi
        "${ABL[@]}" cost scripts/gpu_big.toml "${extra[@]}" >> "$OUT/big.txt" 2>&1
        run_stage "big cell" "$OUT/big.txt" "${ABL[@]}" run scripts/gpu_big.toml --db "$DB" "${extra[@]}"
        ;;
    esac
    [ -f "$DB" ] && cp "$DB" "$OUT/abl.duckdb"  # after each stage: a call cut off at its limit keeps the rest
done
rm -rf "$WORK"
grep -q "exit [^0]" "$OUT/status.txt" && exit 1
exit 0
}

main "$@"
