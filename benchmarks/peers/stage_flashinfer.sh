#!/usr/bin/env bash
# Stage FlashInfer's MLA decode for the GPU machine, which has no network and takes at most 64 MiB per call.
#
# flashinfer-python 0.7.2.post1 is a 62 MB wheel that unpacks to 426 MB (332 MB of it CUDA/CUTLASS sources for its
# JIT) and pulls nvidia-cutlass-dsl (486 MB), cudnn-frontend, nccl4py and cuda-tile. Its MLA decode needs none of
# those at run time when its two kernel modules are compiled ahead: `import flashinfer` treats the missing ones as
# optional, and a module found under flashinfer/data/aot/<name>/<name>.so is loaded instead of JIT-compiled. So
# this script compiles the fa3 (Hopper) MLA module for bf16 and fp8 KV here with nvcc (sm_90a), and writes
#   .whl/flashinfer/flashinfer_mla_sm90.tar.xz   the package's Python files, data/aot/ with the two modules, and
#                                                the 4 MLA source files its planning reads (7.3 MB)
#   .whl/flashinfer/apache_tvm_ffi-*.whl         its one compiled dependency the GPU image lacks (3.3 MB, cp312)
# The GPU image has every other import (torch, numpy, jinja2, filelock, cuda-bindings, nvidia-ml-py, requests,
# tqdm, einops, tabulate, click, packaging). On the GPU machine:
#   mkdir -p /tmp/site && tar -xJf .whl/flashinfer/flashinfer_mla_sm90.tar.xz -C /tmp/site &&
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashinfer/apache_tvm_ffi-*.whl &&
#   export PYTHONPATH=/tmp/site
# Needs here: python3 with pip and torch, nvcc 13.0 (the GPU image's, so the modules match its runtime) at
# /usr/local/cuda. Run from the repository root.
set -euo pipefail

FLASHINFER_VERSION=0.7.2.post1
TVM_FFI_VERSION=0.1.15.post2   # what flashinfer-python ${FLASHINFER_VERSION} resolves to (apache-tvm-ffi<0.2)
STAGE=.whl/flashinfer   # its own folder: other staging lives in .whl/ too
WORK=${WORK:-/tmp/stage_flashinfer}

mkdir -p "$STAGE" "$WORK"
# A local environment to run FlashInfer's own build of the modules (its JIT, driven ahead of time).
python3 -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/pip" install -q "flashinfer-python==$FLASHINFER_VERSION" "apache-tvm-ffi==$TVM_FFI_VERSION"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$STAGE" "apache-tvm-ffi==$TVM_FFI_VERSION"

# This machine has no GPU driver, so no libcuda.so to link against: an empty stub with the driver's soname
# satisfies the linker, and the real driver provides the symbols on the GPU machine.
mkdir -p "$WORK/stub"
echo "" > "$WORK/stub/empty.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$WORK/stub/libcuda.so" "$WORK/stub/empty.c"

export FLASHINFER_WORKSPACE_BASE="$WORK/jit" FLASHINFER_CUDA_ARCH_LIST="9.0a" LIBRARY_PATH="$WORK/stub"
export PATH="/usr/local/cuda/bin:$PATH"
SITE=$("$WORK/venv/bin/python" -c "import flashinfer, pathlib; print(pathlib.Path(flashinfer.__file__).parent.parent)")
rm -rf "$WORK/pkg" && mkdir -p "$WORK/pkg"
"$WORK/venv/bin/python" - "$WORK/pkg/flashinfer/data/aot" <<'EOF'
import shutil, sys
from pathlib import Path
import torch
from flashinfer.jit.attention.modules import gen_batch_mla_module

aot_dir = Path(sys.argv[1])
for kv_dtype in (torch.bfloat16, torch.float8_e4m3fn):
    # The fa3 module for bf16 Q and output, int32 indices, 512 latent + 64 rope dims, no profiler.
    spec = gen_batch_mla_module("fa3", torch.bfloat16, kv_dtype, torch.bfloat16, torch.int32, 512, 64, False)
    spec.build()
    (aot_dir / spec.name).mkdir(parents=True, exist_ok=True)
    shutil.copy2(spec.get_library_path(), aot_dir / spec.name / f"{spec.name}.so")
    print("compiled", spec.name)
EOF
(cd "$SITE" && find flashinfer -name '*.py' -not -path 'flashinfer/data/*' -print0 | \
    xargs -0 cp --parents -t "$WORK/pkg")
# Planning an AOT module still renders its config template and copies its sources (they are not compiled).
(cd "$SITE" && cp --parents -t "$WORK/pkg" flashinfer/data/csrc/batch_mla_config.jinja \
    flashinfer/data/csrc/batch_mla_sm90_plan.cu flashinfer/data/csrc/batch_mla_sm90_run.cu \
    flashinfer/data/csrc/batch_mla_sm90_binding.cu)
tar -C "$WORK/pkg" -cJf "$STAGE/flashinfer_mla_sm90.tar.xz" flashinfer
ls -la "$STAGE"
