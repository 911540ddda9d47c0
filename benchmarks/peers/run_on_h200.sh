#!/usr/bin/env bash
# One H200 run: install the staged peers (stage_flashinfer.sh and stage_flashmla.sh, carried as .whl/flashinfer
# and .whl/flashmla; a missing one becomes "not importable" in the table), run the
# autotuner when tools/autotune.py exists (it writes mixed_mla/tables/h200.json, which the bench's plans then
# use), then the benchmark. Arguments go to `python -m benchmarks`; AUTOTUNE_ARGS to the autotuner, bounded by
# AUTOTUNE_TIMEOUT seconds (AUTOTUNE=0 skips it). Outputs (table.md, results.json, env.json, sweep.png, logs,
# h200.json) go to $OUT, by default benchmarks/results/peers/ (replaced). SPARSE=1 then runs
# benchmarks/sparse_decode.py beside FlashMLA's staged sparse decode (SPARSE_ARGS its arguments) into $OUT/sparse.
#   OUT=$OUT MLA_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/peers/run_on_h200.sh
set -uo pipefail
if [ -z "${OUT:-}" ]; then
    OUT=benchmarks/results/peers
    rm -rf "$OUT"
fi
STAGE=.whl/flashinfer
FLASHMLA_STAGE=.whl/flashmla
SITE=/tmp/site
export PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$SITE"
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}

if [ -f "$STAGE/flashinfer_mla_sm90.tar.xz" ]; then
    tar -xJf "$STAGE/flashinfer_mla_sm90.tar.xz" -C "$SITE" &&
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$STAGE"/apache_tvm_ffi-*.whl
else
    echo "no staged FlashInfer in $STAGE: the table will say it is not importable"
fi
for archive in flash_mla_dense_sm90.tar.xz flash_mla_sparse_sm90.tar.xz vllm_flashmla_fp8_sm90.tar.xz; do
    if [ -f "$FLASHMLA_STAGE/$archive" ]; then
        tar -xJf "$FLASHMLA_STAGE/$archive" -C "$SITE"
    else
        echo "no $archive in $FLASHMLA_STAGE: the table will say it is not importable"
    fi
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv \
    > "$OUT/nvidia-smi.txt" 2>&1

if [ "${AUTOTUNE:-1}" = 1 ] && [ -f tools/autotune.py ]; then
    timeout "${AUTOTUNE_TIMEOUT:-150}" python3 tools/autotune.py ${AUTOTUNE_ARGS:-} 2>&1 | tee "$OUT/autotune.log"
    cp mixed_mla/tables/h200.json "$OUT/" 2>/dev/null || echo "autotune wrote no mixed_mla/tables/h200.json"
    # An autotuner stopped by the timeout inside torch's extension build leaves the build's lock file behind,
    # and the bench's build would wait on it forever.
    find ~/.cache/torch_extensions -name lock -delete 2>/dev/null
fi
python3 -m benchmarks --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
if [ "${SPARSE:-0}" = 1 ]; then
    python3 -m benchmarks.sparse_decode --out "$OUT/sparse" ${SPARSE_ARGS:-} 2>&1 | tee "$OUT/sparse.log"
fi
