#!/usr/bin/env bash
# Same lease, side by side: the shipped 0a1fe41 (835b464 kernels and table) against 1aaa7cc (v49 with the fix and
# the table the release check of 1aaa7cc measured): eval.py benchmark twice each, alternating; then kernel level.
set -uo pipefail
export PYTHONUNBUFFERED=1
root=$(pwd); d=$OUT
mkdir -p /tmp/ab/new && cp submission.py /tmp/ab/new/ && cp -r .build/ab/base /tmp/ab/base
for w in base new; do cp task.py utils.py reference.py eval.py benchmarks.txt /tmp/ab/$w/; done
for i in 1 2; do
  for w in base new; do
    (cd /tmp/ab/$w && PYTHONPATH=$root timeout 150 python3 eval.py benchmark benchmarks.txt) \
      > $d/eval_${w}_$i.txt 2>&1; echo "rc=$?" >> $d/eval_${w}_$i.txt
  done
done
timeout 200 python3 bench/compare_sm90_builds.py run --format fp8 > $d/kernel_fp8.txt 2>&1; echo "rc=$?" >> $d/kernel_fp8.txt
timeout 60 python3 bench/compare_sm90_builds.py check > $d/check.txt 2>&1; echo "rc=$?" >> $d/check.txt
grep -h "geometric\|rc=" $d/eval_*.txt; tail -14 $d/kernel_fp8.txt; tail -3 $d/check.txt
