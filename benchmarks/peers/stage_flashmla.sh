#!/usr/bin/env bash
# Stage two FlashMLA decodes for the GPU machine (no network, python 3.12, torch 2.11.0+cu130, 64 MiB per call):
#
#   FlashMLA's own dense Hopper decode (bf16 KV, page size 64) at deepseek-ai/FlashMLA ${FLASHMLA_COMMIT}: the newest
#     main commit of the snapshot we can read (2026-04-29, the snapshot ends 2026-05-10), which still has
#     csrc/sm90/decode/dense (issue 25 reports its removal upstream around 2026-09, past what we can read).
#     Built: its dense decode, scheduler and combine kernels (bf16 only: FLASH_MLA_DISABLE_FP16) with our
#     flashmla_dense_binding.cpp in place of its api.cpp, which also binds the sparse and sm100 kernels.
#     -> .whl/flashmla/flash_mla_dense_sm90.tar.xz: the flash_mla package (its two Python files + cuda.*.so)
#   FlashMLA's sparse fp8 Hopper decode (DeepSeek-V3.2's 656-byte rows, top-k indices; 64 and 128 heads) at the
#     same commit: csrc/sm90/decode/sparse_fp8's v32_persistent_h64/h128 instantiations with the dense build's
#     scheduler and combine objects, and our flashmla_sparse_binding.cpp (FlashMLA's sparse entry point also
#     dispatches to its sm100 kernels, left out here).
#     -> .whl/flashmla/flash_mla_sparse_sm90.tar.xz: flash_mla_sparse/cuda.*.so (a namespace package of its own,
#        beside the dense flash_mla; benchmarks/sparse_decode.py imports it)
#   vLLM's dense fp8 MLA decode, vllm-project/FlashMLA ${VLLM_FLASHMLA_COMMIT} (its main, 2025-10-22):
#     csrc/extension/sm90/dense_fp8, built as vLLM's CMake builds it (the four sources of its
#     _flashmla_extension_C target), fp8 e4m3 Q and KV with per-tensor descales, page size 64.
#     -> .whl/flashmla/vllm_flashmla_fp8_sm90.tar.xz: vllm_flashmla/_flashmla_extension_C.*.so (importing it
#        registers torch.ops._flashmla_extension_C)
# On the GPU machine (run_on_h200.sh does it): tar -xJf each into /tmp/site, PYTHONPATH=/tmp/site.
#
# Why not the packages' setup.py: both import torch to build, and an extension must be compiled against the
# torch and python the GPU machine runs (C++ ABI, pybind11 module ABI), not this machine's CPU torch. So this
# script downloads the torch ${TORCH_VERSION} wheel for cp312 from PyPI (only its headers and libraries are
# unpacked, nothing is installed), takes Python.h from a local python 3.12, and runs nvcc/g++ with the flags of
# the packages' own builds (sm_90a only). Their kernels use the CUDA runtime alone, so no driver library is needed.
#
# Needs here: the git mirrors of the three repositories (the `fetch` tool; paths below, or FLASHMLA_GIT,
# VLLM_FLASHMLA_GIT, CUTLASS_GIT), python 3.12 with its headers (PYTHON312), pip, nvcc 13.0 at /usr/local/cuda.
# Run from the repository root. ~2.5 min on 2 cores for the dense builds after the first run's ~1.3 GB of wheel
# downloads (kept in $WORK), ~2.5 min more for the sparse one (143 s: its two instantiations side by side, 99 s
# each, then the binding); compile times are printed at the end. Each archive is ~0.1 MB (sparse: 110 KB).
set -euo pipefail

FLASHMLA_COMMIT=9241ae3ef9bac614dd25e45e507e089f888280e0          # deepseek-ai/FlashMLA main, 2026-04-29
FLASHMLA_CUTLASS=147f5673d0c1c3dcf66f78d677fd647e4a020219         # its csrc/cutlass submodule
VLLM_FLASHMLA_COMMIT=46d64a8ebef03fa50b4ae74937276a5c940e3f95     # vllm-project/FlashMLA main, 2025-10-22
VLLM_FLASHMLA_CUTLASS=e94e888df3551224738bfa505787b515eae8352f    # its csrc/cutlass submodule
TORCH_VERSION=2.11.0        # the PyPI wheel is the +cu130 build, the GPU machine's
# torch's ATen/cuda headers include cuBLAS, cuSOLVER and cuSPARSE headers, which this CUDA install lacks: these
# are the versions torch ${TORCH_VERSION} requires (through cuda-toolkit 13.0.2); only their headers are unpacked.
CUDA_LIBRARY_WHEELS=("nvidia-cublas==13.1.0.3.*" "nvidia-cusolver==12.0.4.66.*" "nvidia-cusparse==12.6.3.3.*")
FLASHMLA_GIT=${FLASHMLA_GIT:-/work/.mirror/deepseek-ai+FlashMLA/repo}
VLLM_FLASHMLA_GIT=${VLLM_FLASHMLA_GIT:-/work/.mirror/vllm-project+FlashMLA/repo}
CUTLASS_GIT=${CUTLASS_GIT:-/work/.mirror/NVIDIA+cutlass/repo}
STAGE=.whl/flashmla
WORK=${WORK:-/tmp/stage_flashmla}
CUDA=/usr/local/cuda
BINDING=$PWD/benchmarks/peers/flashmla_dense_binding.cpp
SPARSE_BINDING=$PWD/benchmarks/peers/flashmla_sparse_binding.cpp

for repo in "$FLASHMLA_GIT" "$VLLM_FLASHMLA_GIT" "$CUTLASS_GIT"; do
    git -C "$repo" rev-parse --git-dir >/dev/null 2>&1 || { echo "no git mirror at $repo" >&2; exit 1; }
done
# A python 3.12 that runs (a pyenv shim named python3.12 may not): PYTHON312, python3.12, then pyenv's.
for PYTHON312 in ${PYTHON312:-} python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    "$PYTHON312" -c "" 2>/dev/null && break
done
PY_INCLUDE=$("$PYTHON312" -c "import sys, sysconfig; assert sys.version_info[:2] == (3, 12); print(sysconfig.get_paths()['include'])")
EXT_SUFFIX=$("$PYTHON312" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
mkdir -p "$STAGE" "$WORK"

# torch headers and libraries of the GPU machine's build (the wheel is ~530 MB; kept in $WORK between runs).
TORCH_ROOT=$WORK/torch-$TORCH_VERSION
if [ ! -f "$TORCH_ROOT/torch/version.py" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d "$WORK/wheel" "torch==$TORCH_VERSION"
    unzip -q -o "$WORK"/wheel/torch-"$TORCH_VERSION"-cp312-*.whl 'torch/include/*' 'torch/lib/*' \
        'torch/version.py' -d "$TORCH_ROOT"
fi
if [ ! -f "$TORCH_ROOT/nvidia/cu13/include/cusparse.h" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 -d "$WORK/wheel" "${CUDA_LIBRARY_WHEELS[@]}"
    for wheel in "$WORK"/wheel/nvidia_cu{blas,solver,sparse}-*.whl; do
        unzip -q -o "$wheel" 'nvidia/cu13/include/*' -d "$TORCH_ROOT"
    done
fi
grep -q "__version__ = '$TORCH_VERSION+cu130'" "$TORCH_ROOT/torch/version.py" ||
    { echo "the torch wheel is not $TORCH_VERSION+cu130" >&2; exit 1; }

# Sources at the pinned commits, with the cutlass submodule laid where the packages expect it.
extract() {  # extract GIT COMMIT CUTLASS_COMMIT DEST PATHS...
    local git=$1 commit=$2 cutlass=$3 dest=$4
    shift 4
    rm -rf "$dest" && mkdir -p "$dest/csrc/cutlass"
    git -C "$git" archive "$commit" "$@" | tar -x -C "$dest"
    # (the mirror lacks some of cutlass's images, which git archive reports though it writes the paths asked for)
    git -C "$CUTLASS_GIT" archive "$cutlass" include tools/util/include 2>/dev/null | tar -x -C "$dest/csrc/cutlass"
}
extract "$FLASHMLA_GIT" "$FLASHMLA_COMMIT" "$FLASHMLA_CUTLASS" "$WORK/flashmla" csrc/api csrc/kerutils \
    csrc/params.h csrc/defines.h csrc/utils.h csrc/sm90 csrc/smxx flash_mla
extract "$VLLM_FLASHMLA_GIT" "$VLLM_FLASHMLA_COMMIT" "$VLLM_FLASHMLA_CUTLASS" "$WORK/vllm_flashmla" \
    csrc/extension csrc/pytorch_shim.h csrc/params.h csrc/utils.h

# What torch.utils.cpp_extension adds for a CUDA extension (torch's C++ ABI, the extension macros).
TORCH_INCLUDES=(-I"$TORCH_ROOT/torch/include" -I"$TORCH_ROOT/torch/include/torch/csrc/api/include"
                -I"$PY_INCLUDE" -I"$CUDA/include" -I"$CUDA/include/cccl"
                -I"$TORCH_ROOT/nvidia/cu13/include")
TORCH_DEFINES=(-D_GLIBCXX_USE_CXX11_ABI=1 -DTORCH_API_INCLUDE_EXTENSION_H)
# The nvcc flags of both packages' builds (FlashMLA's setup.py; vLLM's CMake adds the same three --expt/fast-math).
NVCC_FLAGS=(-O3 -DNDEBUG -D_USE_MATH_DEFINES -Wno-deprecated-declarations
            -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ -U__CUDA_NO_HALF2_OPERATORS__
            -U__CUDA_NO_BFLOAT16_CONVERSIONS__ --expt-relaxed-constexpr --expt-extended-lambda --use_fast_math
            -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC)
TIMES=$WORK/times.txt
: > "$TIMES"

compile() {  # compile OUT.o SRC FLAGS...: nvcc for .cu, g++ for .cpp; its wall time goes to $TIMES
    local out=$1 src=$2 start=$SECONDS
    shift 2
    if [[ $src == *.cu ]]; then
        "$CUDA/bin/nvcc" -c "$src" -o "$out" "${NVCC_FLAGS[@]}" "${TORCH_INCLUDES[@]}" "${TORCH_DEFINES[@]}" "$@"
    else
        g++ -c "$src" -o "$out" -O3 -DNDEBUG -fPIC -Wno-deprecated-declarations "${TORCH_INCLUDES[@]}" \
            "${TORCH_DEFINES[@]}" "$@"
    fi
    echo "$((SECONDS - start)) s  $(basename "$src")" >> "$TIMES"
}

link() {  # link OUT.so OBJECTS...: against the wheel's torch libraries (found by soname on the GPU machine)
    local out=$1
    shift
    g++ -shared -s -o "$out" "$@" -L"$TORCH_ROOT/torch/lib" -lc10 -ltorch -ltorch_cpu -ltorch_python -lc10_cuda \
        -ltorch_cuda -L"$CUDA/lib64" -lcudart
}

# build NAME OBJ PKG TOP MODULE VERSION ARCHIVE JOB...: the compile jobs into OBJ (fresh), their objects linked as
# PKG/TOP/MODULE (PKG/TOP as the caller prepared it), VERSION in PKG/TOP/STAGED_FROM (what the peers table names),
# PKG/TOP archived as $STAGE/ARCHIVE; NAME's wall time goes to $TIMES.
build() {
    local name=$1 obj=$2 pkg=$3 top=$4 module=$5 version=$6 archive=$7 start=$SECONDS
    shift 7
    rm -rf "$obj" && mkdir -p "$obj"
    OBJ=$obj run_jobs "$@"
    link "$pkg/$top/$module" "$obj"/*.o
    echo "$version" > "$pkg/$top/STAGED_FROM"
    echo "$name: $((SECONDS - start)) s" >> "$TIMES"
    tar -C "$pkg" -cJf "$STAGE/$archive" "$top"
}

run_jobs() {  # run_jobs CMD...: each argument a command line, two at a time (this machine's cores)
    local pids=() failed=0
    for job in "$@"; do
        while [ "$(jobs -rp | wc -l)" -ge 2 ]; do wait -n || failed=1; done
        eval "$job" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    return $failed
}

# FlashMLA dense (bf16): C++20 and its ptxas register option, as its setup.py; the kernel file first (the long one).
SRC=$WORK/flashmla/csrc
MLA_FLAGS=(-std=c++20 -DFLASH_MLA_DISABLE_FP16 -DTORCH_EXTENSION_NAME=cuda -I"$SRC" -I"$SRC/kerutils/include"
           -I"$SRC/sm90" -I"$SRC/cutlass/include" -I"$SRC/cutlass/tools/util/include")
MLA_PTXAS=--ptxas-options=--register-usage-level=10
rm -rf "$WORK/pkg_flashmla" && mkdir -p "$WORK/pkg_flashmla"
cp -r "$WORK/flashmla/flash_mla" "$WORK/pkg_flashmla/"
build "FlashMLA dense" "$WORK/obj_flashmla" "$WORK/pkg_flashmla" flash_mla "cuda$EXT_SUFFIX" \
    "deepseek-ai/FlashMLA@${FLASHMLA_COMMIT:0:7} (sm90 dense bf16; nvcc 13.0, torch $TORCH_VERSION)" \
    flash_mla_dense_sm90.tar.xz \
    "compile \$OBJ/bf16.o $SRC/sm90/decode/dense/instantiations/bf16.cu \${MLA_FLAGS[@]} $MLA_PTXAS" \
    "compile \$OBJ/sched.o $SRC/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu \${MLA_FLAGS[@]} $MLA_PTXAS" \
    "compile \$OBJ/combine.o $SRC/smxx/decode/combine/combine.cu \${MLA_FLAGS[@]} $MLA_PTXAS" \
    "compile \$OBJ/binding.o $BINDING \${MLA_FLAGS[@]}"

# FlashMLA sparse fp8 (V3.2): the same flags; the scheduler and combine objects are the dense build's (same
# sources, same flags), the two instantiations first (the long ones).
SPARSE=$SRC/sm90/decode/sparse_fp8/instantiations
rm -rf "$WORK/pkg_flashmla_sparse" && mkdir -p "$WORK/pkg_flashmla_sparse/flash_mla_sparse"
build "FlashMLA sparse" "$WORK/obj_flashmla_sparse" "$WORK/pkg_flashmla_sparse" flash_mla_sparse "cuda$EXT_SUFFIX" \
    "deepseek-ai/FlashMLA@${FLASHMLA_COMMIT:0:7} (sm90 sparse fp8 V3.2; nvcc 13.0, torch $TORCH_VERSION)" \
    flash_mla_sparse_sm90.tar.xz \
    "compile \$OBJ/v32_h64.o $SPARSE/v32_persistent_h64.cu \${MLA_FLAGS[@]} $MLA_PTXAS" \
    "compile \$OBJ/v32_h128.o $SPARSE/v32_persistent_h128.cu \${MLA_FLAGS[@]} $MLA_PTXAS" \
    "cp $WORK/obj_flashmla/sched.o $WORK/obj_flashmla/combine.o \$OBJ/" \
    "compile \$OBJ/binding.o $SPARSE_BINDING \${MLA_FLAGS[@]}"

# vLLM's dense fp8: C++17 as vLLM's CMake (its CMAKE_CXX_STANDARD) for this target.
SRC=$WORK/vllm_flashmla/csrc
FP8_FLAGS=(-std=c++17 -DTORCH_EXTENSION_NAME=_flashmla_extension_C -I"$SRC" -I"$SRC/extension/sm90/dense_fp8"
           -I"$SRC/cutlass/include" -I"$SRC/cutlass/tools/util/include")
# A folder of its own (a namespace package: vllm_flashmla._flashmla_extension_C), as vLLM keeps it in vllm/.
rm -rf "$WORK/pkg_vllm_fp8" && mkdir -p "$WORK/pkg_vllm_fp8/vllm_flashmla"
build "vLLM FlashMLA dense fp8" "$WORK/obj_vllm_fp8" "$WORK/pkg_vllm_fp8" vllm_flashmla \
    "_flashmla_extension_C$EXT_SUFFIX" \
    "vllm-project/FlashMLA@${VLLM_FLASHMLA_COMMIT:0:7} (sm90 dense fp8 extension; nvcc 13.0, torch $TORCH_VERSION)" \
    vllm_flashmla_fp8_sm90.tar.xz \
    "compile \$OBJ/fp8.o $SRC/extension/sm90/dense_fp8/flash_fwd_mla_fp8_sm90.cu \${FP8_FLAGS[@]}" \
    "compile \$OBJ/metadata.o $SRC/extension/sm90/dense_fp8/flash_fwd_mla_metadata.cu \${FP8_FLAGS[@]}" \
    "compile \$OBJ/pybind.o $SRC/extension/sm90/dense_fp8/pybind.cpp \${FP8_FLAGS[@]}" \
    "compile \$OBJ/torch_api.o $SRC/extension/torch_api.cpp \${FP8_FLAGS[@]}"

cat "$TIMES"
ls -la "$STAGE"
