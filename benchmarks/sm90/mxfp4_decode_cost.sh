#!/usr/bin/env bash
# Experiment (issue 25, 2026-12-05): static SASS cost of candidate e2m1 decodes on sm_90a, no GPU needed.
# Compiles mxfp4_decode_cost.cu with ptxas 13.0, disassembles with nvdisasm (PyPI nvidia-cuda-nvdisasm, the
# CUDA toolkit here has none), and counts per kernel the instructions other than loads, stores and address setup,
# per 8 decoded values (each kernel decodes 16 words of 8 codes per thread). Outcome: docs/sm90.md, "MXFP4 on Hopper".
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${WORK:-/tmp/mxfp4_decode_cost}
mkdir -p "$work"
[ -x "$work/x/nvidia/cu13/bin/nvdisasm" ] || {
  python3 -m pip download -q --no-deps -d "$work" nvidia-cuda-nvdisasm
  python3 -m zipfile -e "$work"/nvidia_cuda_nvdisasm-*.whl "$work/x"
  chmod +x "$work/x/nvidia/cu13/bin/nvdisasm"
}
/usr/local/cuda/bin/nvcc -arch=sm_90a -cubin -O3 -o "$work/cost.cubin" "$here/mxfp4_decode_cost.cu"
"$work/x/nvidia/cu13/bin/nvdisasm" -c "$work/cost.cubin" > "$work/cost.sass"
python3 - "$work/cost.sass" <<'PY'
import collections, re, sys
text = open(sys.argv[1]).read()
parts = re.split(r'\n\s*\.text\.(\w+):', text)
address = ('LDG', 'STG', 'LDC', 'S2R', 'EXIT', 'BRA', 'NOP', 'ULDC', 'S2UR', 'LDS', 'STS', 'MOV', 'UMOV', 'ISETP',
           'CS2R', 'IMAD.WIDE', 'LEA', 'IADD3.X')
for name, body in zip(parts[1::2], parts[2::2]):
    ops = collections.Counter(re.findall(r'/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)', body))
    work = {k: v for k, v in ops.items() if not k.startswith(address)}
    print(f"{name:32s} {sum(work.values()) / 16:6.2f} per 8 values  {dict(sorted(work.items()))}")
PY
