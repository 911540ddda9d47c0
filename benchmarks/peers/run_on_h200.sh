#!/usr/bin/env bash
# One H200 run: install the staged FlashInfer (stage_flashinfer.sh, carried as .whl/flashinfer), run the
# autotuner when tools/autotune.py exists (it writes mixed_mla/tables/h200.json, which the bench's plans then
# use), then the benchmark. Arguments go to `python -m benchmarks`; AUTOTUNE_ARGS to the autotuner, bounded by
# AUTOTUNE_TIMEOUT seconds (AUTOTUNE=0 skips it). Outputs (table.md, results.json, env.json, sweep.png, logs,
# h200.json) go to $OUT, by default benchmarks/results/peers/ (replaced).
#   OUT=$OUT MLA_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/peers/run_on_h200.sh
set -uo pipefail
if [ -z "${OUT:-}" ]; then
    OUT=benchmarks/results/peers
    rm -rf "$OUT"
fi
STAGE=.whl/flashinfer
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

if [ -f "$STAGE/flashinfer_mla_sm90.tar.xz" ]; then
    mkdir -p /tmp/site
    tar -xJf "$STAGE/flashinfer_mla_sm90.tar.xz" -C /tmp/site &&
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$STAGE"/apache_tvm_ffi-*.whl &&
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
else
    echo "no staged FlashInfer in $STAGE: the table will say it is not importable"
fi
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
