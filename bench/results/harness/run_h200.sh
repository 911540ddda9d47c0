#!/usr/bin/env bash
# The harness smoke run on the H200 (one device call). Needs, carried from the developer machine:
#   .whl/extracted/aiter/utility/fp4_utils.py   (from the amd-aiter wheel on PyPI) for the MXFP4 golden vectors
#   .leaderboard/eval.py                        the leaderboard's UNMODIFIED eval.py (gpu-mode/reference-kernels,
#                                               problems/amd_202602/eval.py; never committed here)
# Writes everything under $1 (the device's $OUT).
set -uo pipefail
out=$1
root=$(pwd)
export PYTHONUNBUFFERED=1
log="$out/run.log"
{
  echo "commit: ${COMMIT:-unknown} (plus the uncommitted files of other engineers present at the time)"
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "leaderboard eval.py from reference-kernels commit $(cat .leaderboard/COMMIT)"
} >"$log" 2>&1

echo "== golden MXFP4 vectors" >>"$log"
timeout 45 python3 tools/make_golden_mxfp4.py --fp4-utils .whl/extracted/aiter/utility/fp4_utils.py \
  --out "$out/mxfp4_golden.npz" >>"$log" 2>&1
echo "rc=$?" >>"$log"

if [ -f submission.py ]; then echo "submission: submission.py of the tree" >>"$log"
else cp tests/plain_torch_submission.py submission.py; echo "submission: tests/plain_torch_submission.py" >>"$log"; fi

echo "== our eval.py test tests.txt, POPCORN_FD unset" >>"$log"
timeout 35 python3 eval.py test tests.txt >"$out/ours_test_table.txt" 2>&1
echo "rc=$?" >>"$log"
echo "== our eval.py test tests.txt, POPCORN_FD=3" >>"$log"
POPCORN_FD=3 timeout 35 python3 eval.py test tests.txt 3>"$out/ours_test_popcorn.txt" >>"$log" 2>&1
echo "rc=$?" >>"$log"

# The leaderboard's layout: its eval.py beside our task.py / utils.py / reference.py / submission.py.
lb=/tmp/leaderboard_run
mkdir -p "$lb" && cp task.py utils.py reference.py submission.py "$lb/" && cp .leaderboard/eval.py "$lb/"
head -2 benchmarks.txt >"$lb/bench2.txt"
echo "== leaderboard eval.py test tests.txt, POPCORN_FD=3" >>"$log"
(cd "$lb" && PYTHONPATH="$root" POPCORN_FD=3 timeout 35 python3 eval.py test "$root/tests.txt" \
  3>"$out/leaderboard_test_popcorn.txt" >>"$log" 2>&1)
echo "rc=$?" >>"$log"
echo "== leaderboard eval.py benchmark (first 2 benchmark cases), POPCORN_FD=3" >>"$log"
(cd "$lb" && PYTHONPATH="$root" POPCORN_FD=3 timeout 25 python3 eval.py benchmark bench2.txt \
  3>"$out/leaderboard_bench2_popcorn.txt" >>"$log" 2>&1)
echo "rc=$?" >>"$log"
echo "== our eval.py benchmark (first 2 benchmark cases), POPCORN_FD unset" >>"$log"
timeout 25 python3 eval.py benchmark "$lb/bench2.txt" >"$out/ours_bench2_table.txt" 2>&1
echo "rc=$?" >>"$log"
cat "$log"
