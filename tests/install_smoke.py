"""The installed package's smoke test, run by tests/test_install.py with a fresh venv's python from outside the
repository: `python install_smoke.py <repository mixed_mla dir>`.

It checks that the import comes from the install (not the repository), then: plan + run, decode, decode_paged (and
their LSE) on CPU against exact attention; every kernel source the repository holds readable through
mixed_mla.kernels; build_info saying no kernel is built in (the pure-Python wheel); every planner table the planner
names loaded with entries.
"""
import sys
from pathlib import Path

import torch

import mixed_mla
from mixed_mla import exact, kernels, planner

repository_package = Path(sys.argv[1]).resolve()
installed = Path(mixed_mla.__file__).resolve().parent
assert installed != repository_package, f"imported the repository's package ({installed}), not the installed one"

gen = torch.Generator().manual_seed(0)
q = torch.randn(3, 16, 576, generator=gen).to(torch.bfloat16)
kv = torch.randn(40, 1, 576, generator=gen).to(torch.bfloat16)
qo_indptr = torch.tensor([0, 1, 3], dtype=torch.int32)
kv_indptr = torch.tensor([0, 8, 40], dtype=torch.int32)
reference = exact.exact_attention(q, kv, "bf16", qo_indptr, kv_indptr, 1 / 24)
planned = mixed_mla.plan(qo_indptr, kv_indptr, num_heads=16, kv_format="bf16")
# the torch backend's strict bound (worst measured 0.0019: benchmarks/results/bounds/torch.json), not a loose 0.02
bound = exact.STRICT_BOUND[("bf16", "torch")]
assert exact.relative_l2(planned.run(q, kv, qo_indptr, kv_indptr), reference) <= bound
out = mixed_mla.decode(q, kv, qo_indptr, kv_indptr, kv_format="bf16")
assert exact.relative_l2(out, reference) <= bound
# the same 40 rows as 5 pages of 8, the second sequence's pages in reverse order
pages = kv.view(5, 8, 576)
block_table = torch.tensor([[0, -1, -1, -1], [4, 3, 2, 1]], dtype=torch.int32)
reordered = torch.cat([kv[:8], kv[32:40], kv[24:32], kv[16:24], kv[8:16]]).view(5, 8, 576)
seq_lens = torch.tensor([8, 32], dtype=torch.int32)
out = mixed_mla.decode_paged(q, reordered, qo_indptr, block_table, seq_lens, kv_format="bf16")
assert exact.relative_l2(out, reference) <= bound

expected_sources = sorted(p.relative_to(repository_package / "kernels").as_posix()
                          for p in (repository_package / "kernels").rglob("*") if p.suffix in kernels.SOURCE_SUFFIXES)
assert expected_sources, "no kernel sources found in the repository"
for relpath in expected_sources:
    assert kernels.read(relpath) == (repository_package / "kernels" / relpath).read_text(), relpath
# a pure-Python install: every kernel directory JIT-built on first use (none loaded on the CPU)
assert all(entry["built"] == "not built into this install" and entry["loaded"] is None
           for entry in mixed_mla.build_info()["kernels"].values()), mixed_mla.build_info()
for arch, filename in planner.TABLE_FILES.items():
    assert planner.table_for(arch), f"planner table {filename} missing or empty in the install"
print(f"install smoke passed: {installed}, {len(expected_sources)} kernel sources, {len(planner.TABLE_FILES)} tables")
