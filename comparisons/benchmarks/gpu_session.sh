#!/usr/bin/env bash
# The GPU checks of issue #14 in one call of a CUDA machine with no network (a device session's budget
# allows one or two such calls). Run from the repository root:
#
#     bash comparisons/benchmarks/gpu_session.sh KIT OUT [SECONDS] [STEPS]
#
# KIT holds what the machine cannot download, prepared on a machine with a network:
#   KIT/falkon-src/        Falkon's public source (git clone https://github.com/FalkonML/falkon; Falkon's setup.py
#                          imports pykeops and keopscore, so
#   KIT/whl/               holds their sdists: pip download --no-deps --no-binary=:none: -d KIT/whl pykeops keopscore)
#   KIT/flights200k.npz    python -m joker_ext.comparisons.benchmarks.falkon_gpu --prepare-flights KIT/flights200k.npz
# OUT receives the logs and the benchmarks' JSON lines. SECONDS (default 560) bounds the whole run: each step gets
# what is left, and the order is the order of importance (session 22 ran steps 1-3 in about 520 s on an H100).
# STEPS (default "flights20k synth1m flights50k") picks the data sets of step 2, in order.
#
# Learnt on the machine (session 22): Falkon is built with pykeops importable, which its setup needs, and run with
# pykeops moved aside (with it importable, Falkon's default keops_active='auto' compiles a KeOps module on first use
# and failed there); joker_ext is installed into a folder of its own and every step runs outside the repository
# (from the root, `import joker_ext` finds the source folder, which lacks the `joker_ext.comparisons` mapping).
set -u
KIT=$(realpath "$1"); OUT=$(realpath "$2"); BUDGET=${3:-560}; STEPS=${4:-flights20k synth1m flights50k}
ROOT=$(pwd); T0=$(date +%s); export PYTHONUNBUFFERED=1
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
say() { echo "[t=$(( $(date +%s) - T0 )) s] $*"; }
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/joker_pkg . > "$OUT/pip_joker.log" 2>&1 \
    || { say "joker_ext install failed"; tail -5 "$OUT/pip_joker.log"; exit 1; }
( python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/falkon_pkg "$KIT"/whl/*.tar.gz \
  && cd "$KIT/falkon-src" && MAX_JOBS=$(nproc) python3 -m pip install -q --no-index --no-deps --no-build-isolation \
     --target /tmp/falkon_pkg . \
  && mkdir -p /tmp/keops_aside && mv /tmp/falkon_pkg/pykeops* /tmp/falkon_pkg/keopscore* /tmp/keops_aside/ ) \
    > "$OUT/falkon_build.log" 2>&1 &
build=$!
export PYTHONPATH=/tmp/joker_pkg

# 1. Every engine on CUDA against the CPU (tests/core/test_cuda.py, the memory estimates, the harness's solvers); the
#    two test folders' conftest modules share a name, so one pytest run each
cd /tmp
say "CUDA tests"
timeout $(( $(left) / 3 )) python3 -m pytest -q -p no:cacheprovider -k "cuda or gpu" "$ROOT/tests/core/test_cuda.py" \
    "$ROOT/tests/core/test_memory.py" "$ROOT/tests/test_fit_plan.py" "$ROOT/tests/test_validation_entry_points.py" \
    -rs -s --durations=12 2>&1 | tee "$OUT/cuda_tests.log" | grep -v "^\.*$" | tail -25
timeout 60 python3 -m pytest -q -p no:cacheprovider -k cuda "$ROOT/tests/comparisons/test_solvers.py" -rs 2>&1 \
    | tee "$OUT/cuda_tests_solvers.log" | tail -8

wait $build; say "Falkon build rc=$?"
export PYTHONPATH=/tmp/joker_pkg:/tmp/falkon_pkg
python3 -c "import falkon; print('falkon', falkon.__version__)" || exit 1

# 2. JokerFalkon beside Falkon at Falkon's calibrated caps (falkon_gpu_h200_s12.md), then M = 50,000
declare -A SETTINGS=([flights20k]="0.24 20" [synth1m]="0.29 30" [flights50k]="0.6 30")
for name in $STEPS; do
    set -- $name ${SETTINGS[$name]}
    t=$(left); [ "$t" -gt 90 ] || { say "no time left for $1"; continue; }
    say "$1 at max_gpu_mem $2 GiB"
    timeout "$t" python3 -m joker_ext.comparisons.benchmarks.falkon_gpu_capped --flights-npz "$KIT/flights200k.npz" \
        --repeats 1 --out "$OUT/capped.jsonl" --configs "$1" --caps "$2" --joker-max-time "$3" --timeout "$t" 2>&1 \
        | tee "$OUT/$1.log" | grep -v '"trace"' | tail -9
done

# 3. The exact engines on CUDA, every built-in loss at n = 10,000, beside scikit-learn on the machine's CPU
t=$(left)
[ "$t" -gt 60 ] && timeout "$t" python3 -m joker_ext.comparisons.benchmarks.engines --exact-n 10000 --falkon-n \
    --device cuda --threads 8 2>&1 | tee "$OUT/exact_cuda.log" | grep -v -i "warn\|sparse_coo" | tail -12
say "done"
