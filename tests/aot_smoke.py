"""The kernels built ahead of time load and run, with no JIT build: run on an sm_90 GPU machine with the python of a
venv where the wheel `pip wheel --no-deps --no-build-isolation .` made is installed, from outside the repository,
with TORCH_EXTENSIONS_DIR pointing at an empty directory: `python aot_smoke.py <repository mixed_mla dir>`
(docs/design.md#built-kernels gives the commands).

It checks that the import comes from the install, that build_info finds both sm90 modules built in and usable, that
a paged fp8 decode (through cuda_sm90) is exact attention within the path's bound and a cache write gives the torch
writer's bytes, that build_info then reports both as loaded "built", and that the JIT cache is still empty.
"""
import os
import sys
from pathlib import Path

import torch

import mixed_mla
from mixed_mla import append, exact, formats, paged_cache, selfcheck
from mixed_mla.constants import DEFAULT_SM_SCALE, QK_HEAD_DIM

SM90_DIRS = ("sm90/decode", "sm90/cache_write")

repository_package = Path(sys.argv[1]).resolve()
installed = Path(mixed_mla.__file__).resolve().parent
assert installed != repository_package, f"imported the repository's package ({installed}), not the installed one"
jit_cache = Path(os.environ["TORCH_EXTENSIONS_DIR"])
assert not jit_cache.exists() or not any(jit_cache.iterdir()), f"{jit_cache} is not empty: pass an empty directory"
info = mixed_mla.build_info()["kernels"]
assert all(info[d]["built"] is True for d in SM90_DIRS), info

gen = torch.Generator().manual_seed(0)
q_lens, kv_lens = [1, 1, 2], [700, 33, 4000]
q = torch.randn(sum(q_lens), 16, QK_HEAD_DIM, generator=gen).to(torch.bfloat16).cuda()
kv = torch.randn(sum(kv_lens), 1, QK_HEAD_DIM, generator=gen).to(torch.bfloat16).cuda()
contiguous = formats.quantize_fp8(kv)
cache, table, seq_lens = selfcheck.paged_view(contiguous, "fp8", kv_lens, 64, gen)
qo_indptr = torch.tensor([0, 1, 2, 4], dtype=torch.int32, device="cuda")
kv_indptr = torch.tensor([0, 700, 733, 4733], dtype=torch.int32, device="cuda")
planned = mixed_mla.plan_paged(qo_indptr, table, seq_lens, num_heads=16, kv_format="fp8", page_size=64, max_q_len=2,
                               backend="cuda_sm90")
error = exact.strict_error(planned.run(q, cache, qo_indptr, table, seq_lens), q, contiguous, "fp8", qo_indptr,
                           kv_indptr, DEFAULT_SM_SCALE)
assert error <= exact.STRICT_BOUND[("fp8", "cuda_sm90")], error

rows = torch.randn(40, QK_HEAD_DIM, generator=gen).to(torch.bfloat16).cuda()
slots = torch.randperm(128, generator=gen)[:40].cuda()
scale = torch.tensor([0.02], device="cuda")
written = []
for use_kernel in (True, False):
    data = torch.zeros(2, 64, QK_HEAD_DIM, dtype=torch.uint8, device="cuda")
    if use_kernel:
        mixed_mla.concat_and_cache_mla(rows[:, :512], rows[:, 512:], data, slots, "fp8", scale)
    else:
        parsed = paged_cache.paged_cache_of((data, scale), "fp8", torch.device("cuda"))
        append.torch_write(rows[:, :512], rows[:, 512:], parsed, slots, "fp8", "single", scale.reshape(()), None)
    written.append(data)
assert torch.equal(*written), "the built cache-write kernel differs from the torch writer"
append.raise_append_errors("cuda")

info = mixed_mla.build_info()["kernels"]
assert all(info[d]["loaded"] == "built" for d in SM90_DIRS), info
assert not jit_cache.exists() or not any(jit_cache.iterdir()), f"something was JIT-built into {jit_cache}"
print(f"aot smoke passed: {installed}; strict error {error:.5f}; {', '.join(SM90_DIRS)} loaded built, nothing "
      f"JIT-built")
