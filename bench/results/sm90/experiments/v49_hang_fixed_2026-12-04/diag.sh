#!/usr/bin/env bash
# v49's hang under compute-sanitizer: the held-back build (a7730ce) against the fixed one (1aaa7cc), garbage indptr.
set -uo pipefail
export PYTHONUNBUFFERED=1
d=$OUT
root=$(pwd)
build='import torch; from mixed_mla.backends import cuda_sm90; print("build:", cuda_sm90.available(torch.device("cuda")))'
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; compute-sanitizer --version | tail -1; } > $d/env.txt 2>&1
python3 -c "$build" >> $d/env.txt 2>&1
cp -r "$root" /tmp/held && cp .build/v49_held_back/decode_split.cuh /tmp/held/mixed_mla/kernels/sm90/decode/
(cd /tmp/held && python3 -c "$build") >> $d/env.txt 2>&1
run_garbage() {  # dir label limit
  local t0=$(date +%s)
  (cd "$1" && timeout "$3" compute-sanitizer --tool memcheck --error-exitcode 9 \
     python3 -m pytest -q -p no:cacheprovider tests/test_cuda_sm90.py -k garbage) > $d/$2.txt 2>&1
  echo "rc=$? after $(( $(date +%s) - t0 )) s" >> $d/$2.txt
}
run_garbage "$root" fixed_memcheck_garbage_1 90
run_garbage /tmp/held held_back_memcheck_garbage 90
run_garbage "$root" fixed_memcheck_garbage_2 90
sel="garbage or short_max_q_len or byte_lookup or L8 or L9"
for tool in memcheck racecheck synccheck; do
  t0=$(date +%s)
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 \
    python3 -m pytest -q -p no:cacheprovider tests/test_cuda_sm90.py -k "$sel" > $d/fixed_$tool.txt 2>&1
  echo "rc=$? after $(( $(date +%s) - t0 )) s" >> $d/fixed_$tool.txt
done
tail -n 4 $d/*.txt
