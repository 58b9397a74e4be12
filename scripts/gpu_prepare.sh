#!/usr/bin/env bash
# Prepare, on a machine with network, what an offline GPU machine needs to run scripts/gpu_run.sh.
#
# The GPU image already holds Python 3.12, torch, triton and most of abl's dependencies
# (docs/gpu.md); it lacks duckdb. This puts into a git-ignored folder (default .gpu-wheels/):
#   - the duckdb wheel for CPython 3.12, manylinux x86-64;
#   - liger-kernel and fla-core (pure Python over Triton: the kernel benchmark's peers) and
#     nvidia-ml-py (NVML's bindings, for the grid's GPU busy share),
#     each only if the folder, the working tree and it still fit the budget (default 64 MiB,
#     what travels to the GPU machine per call).
# The project itself is installed from the tree on the GPU machine (scripts/gpu_run.sh), so
# the folder never holds a stale copy of it.
#
# Usage: bash scripts/gpu_prepare.sh            (environment: ABL_GPU_WHEELS, ABL_GPU_BUDGET_MIB, PYTHON)
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${ABL_GPU_WHEELS:-.gpu-wheels}
BUDGET=$(( ${ABL_GPU_BUDGET_MIB:-64} * 1024 * 1024 ))
PY=${PYTHON:-python3}
DUCKDB=${ABL_GPU_DUCKDB:-duckdb>=1.0}
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
          --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64 --platform any)

if ! git check-ignore -q "$DEST/x.whl"; then
    echo "error: $DEST/ is not git-ignored; it must not be committed (see .gitignore)" >&2
    exit 2
fi
mkdir -p "$DEST"

# bytes of what travels: tracked and untracked-not-ignored files, plus the wheel folder
tree_bytes() {
    git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null \
        | awk '{s += $1} END {print s + 0}'
    return 0
}
folder_bytes() {
    local n=0 f
    for f in "$DEST"/*.whl; do [ -e "$f" ] && n=$((n + $(stat -c %s "$f"))); done
    echo "$n"
}

fetch() {  # fetch SPEC OPTIONAL: download SPEC's wheel; an optional one is kept only within the budget
    local spec=$1 optional=$2 tmp
    tmp=$(mktemp -d)
    if ! "$PY" -m pip download -q --no-deps "${PLATFORM[@]}" -d "$tmp" "$spec"; then
        rm -rf "$tmp"
        if [ "$optional" = 1 ]; then echo "skipped $spec: no wheel could be downloaded"; return 0; fi
        echo "error: could not download $spec" >&2; return 1
    fi
    local add total
    add=0
    for whl in "$tmp"/*.whl; do add=$((add + $(stat -c %s "$whl"))); done
    total=$(( $(tree_bytes) + $(folder_bytes) + add ))
    if [ "$optional" = 1 ] && [ "$total" -gt "$BUDGET" ]; then
        echo "skipped $spec: $((add / 1024)) KiB would bring what travels to $((total / 1048576)) MiB (budget $((BUDGET / 1048576)) MiB)"
        rm -rf "$tmp"; return 0
    fi
    for whl in "$tmp"/*.whl; do
        # one version of each distribution: an older copy would stop the offline install
        rm -f "$DEST/$(basename "$whl" | cut -d- -f1)"-*.whl
        mv "$whl" "$DEST/"
    done
    rm -rf "$tmp"
    echo "kept $spec ($((add / 1024)) KiB)"
}

fetch "$DUCKDB" 0
fetch liger-kernel 1
fetch fla-core 1
fetch nvidia-ml-py 1  # NVML's bindings: the grid's GPU busy share (abl.run.busy); pure Python, small
total=$(( $(tree_bytes) + $(folder_bytes) ))
echo "$DEST/: $(ls "$DEST" | tr '\n' ' ')"
echo "what travels: $((total / 1048576)) MiB of $((BUDGET / 1048576)) MiB (the working tree and $DEST/)"
if [ "$total" -gt "$BUDGET" ]; then
    echo "error: over the budget; remove optional wheels from $DEST/" >&2
    exit 1
fi
