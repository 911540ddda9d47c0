"""Context-parallel decode (mixed_mla.context_parallel): sequences' paged caches split across 2 and 4 gloo processes
on the CPU, each rank decoding its part with return_lse, the parts merged by their LSE. The merged result equals a
one-rank decode of the whole sequences, and exact attention, within the torch path's strict bound, and its LSE the
exact one within LSE_BOUND, with a rank holding none of a sequence and a sequence no rank holds. The negative case:
the same parts averaged without their LSE weights are far outside the bound. merge_by_lse alone: exact with -inf
parts (their outputs never read), and the union of key parts equals attention over all keys.
"""
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mixed_mla import api, context_parallel, exact, selfcheck
from mixed_mla.constants import DEFAULT_SM_SCALE, QK_HEAD_DIM
from mixed_mla.formats import quantize_fp8
from mixed_mla.lse_merge import merge_by_lse
from mixed_mla.paged import decode_paged

from kernel_mutations import take_rows

HEADS = 16
PAGE_SIZE = 16
# Whole-sequence lengths: one held by a single rank (the others hold nothing of it), one that no rank holds, and
# longer ones cut across every rank.
KV_LENS = (700, 1, 0, 300, 1030)
FORMATS = ("bf16", "fp8")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "context_parallel_decode.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def part_positions(kv_len: int, rank: int, world: int, interleaved: bool) -> torch.Tensor:
    """The positions of a kv_len-token sequence rank `rank` holds: a contiguous range (uneven cuts: a rank may hold
    none), or every world-th token (vLLM's interleaving)."""
    if interleaved:
        return torch.arange(min(rank, kv_len), kv_len, world)
    cuts = [0] + sorted((kv_len * (2 * k + 1)) // (2 * world + 1) for k in range(world - 1)) + [kv_len]
    return torch.arange(cuts[rank], cuts[rank + 1])


def global_case(kv_format, seed=6):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(len(KV_LENS), HEADS, QK_HEAD_DIM, generator=gen).to(torch.bfloat16)
    kv = torch.randn(sum(KV_LENS), 1, QK_HEAD_DIM, generator=gen).to(torch.bfloat16)
    cache = kv if kv_format == "bf16" else quantize_fp8(kv)   # one scale for the whole cache: the parts share it
    kv_indptr = torch.tensor([0, *KV_LENS]).cumsum(0).to(torch.int32)
    return q, cache, kv_indptr


def rank_part(cache, kv_format, kv_indptr, rank, world, interleaved, seed):
    """(paged cache, block table, seq_lens) of this rank's positions of every sequence (selfcheck.paged_view:
    pages out of order, NaN in every row no sequence owns)."""
    rows = torch.cat([kv_indptr[b] + part_positions(n, rank, world, interleaved) for b, n in enumerate(KV_LENS)])
    lens = [len(part_positions(n, rank, world, interleaved)) for n in KV_LENS]
    return selfcheck.paged_view(take_rows(cache, kv_format, rows.long()), kv_format, lens, PAGE_SIZE,
                                torch.Generator().manual_seed(seed))


def _worker(rank, world, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        for kv_format in FORMATS:
            for interleaved in (False, True):
                check_rank(rank, world, kv_format, interleaved)
    finally:
        dist.destroy_process_group()


def check_rank(rank, world, kv_format, interleaved):
    q, cache, kv_indptr = global_case(kv_format)
    paged, table, seq_lens = rank_part(cache, kv_format, kv_indptr, rank, world, interleaved, seed=rank)
    out, lse = context_parallel.decode_context_parallel(q, paged, table, seq_lens, kv_format=kv_format,
                                                        backend="torch", strict=True)
    qo_indptr = torch.arange(len(KV_LENS) + 1, dtype=torch.int32)
    one_rank, one_rank_lse = api.decode(q, cache, qo_indptr, kv_indptr, kv_format=kv_format, backend="torch",
                                        return_lse=True)
    ref, ref_lse = exact.exact_attention(q, cache, kv_format, qo_indptr, kv_indptr, DEFAULT_SM_SCALE,
                                         return_lse=True)
    bound = exact.STRICT_BOUND[(kv_format, "torch")]
    assert exact.relative_l2(out, ref) <= bound and exact.relative_l2(out, one_rank.double()) <= bound
    assert exact.lse_error(lse, ref_lse) <= exact.LSE_BOUND["torch"]
    assert exact.lse_error(lse, one_rank_lse.double()) <= exact.LSE_BOUND["torch"]
    empty = KV_LENS.index(0)
    assert out[empty].abs().max() == 0 and torch.isneginf(lse[empty]).all()
    # The negative case: the parts' outputs averaged without their LSE weights.
    part_out, _ = decode_paged(q, paged, qo_indptr, table, seq_lens, kv_format=kv_format, backend="torch",
                               return_lse=True)
    parts = [torch.empty_like(part_out) for _ in range(world)]
    dist.all_gather(parts, part_out)
    unweighted = torch.stack(parts).float().mean(dim=0)
    assert exact.relative_l2(unweighted, ref) > 10 * bound


@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_decode_under_gloo_equals_one_rank(world):
    mp.spawn(_worker, args=(world, _free_port()), nprocs=world, join=True)


def test_the_example_runs_under_torchrun_with_gloo():
    """examples/context_parallel_decode.py as its docstring runs it (torchrun, 2 processes, gloo), smaller."""
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             str(EXAMPLE), "--batch", "3", "--kv-len", "1500"], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0 and "2 ranks (gloo, torch)" in result.stdout and ": ok" in result.stdout, \
        result.stdout + result.stderr


# ---- merge_by_lse alone ----

def _attention(q, keys, sm_scale=DEFAULT_SM_SCALE):
    """float64 (out, lse) of q (rows, 576) over keys (n, 576), V = the keys' first 512 dims."""
    scores = (q.double() @ keys.double().T) * sm_scale
    return torch.softmax(scores, -1) @ keys.double()[:, :512], torch.logsumexp(scores, -1)


def test_the_union_of_key_parts_is_attention_over_all_keys():
    gen = torch.Generator().manual_seed(3)
    q, keys = torch.randn(5, QK_HEAD_DIM, generator=gen), torch.randn(900, QK_HEAD_DIM, generator=gen)
    full, full_lse = _attention(q, keys)
    parts = [_attention(q, keys[lo:hi]) for lo, hi in ((0, 10), (10, 600), (600, 900))]
    out, lse = merge_by_lse([p[0] for p in parts], [p[1] for p in parts])
    assert exact.relative_l2(out, full) < 1e-6 and (lse.double() - full_lse).abs().max() < 1e-5
    unweighted = torch.stack([p[0] for p in parts]).mean(0)   # the negative case
    assert exact.relative_l2(unweighted, full) > 0.1


def test_an_empty_part_weighs_exactly_nothing_and_is_never_read():
    gen = torch.Generator().manual_seed(4)
    out = torch.randn(2, 3, 8, generator=gen)
    lse = torch.randn(2, 3, generator=gen)
    garbage = torch.full((3, 8), float("nan"))
    merged, merged_lse = merge_by_lse([garbage, out[0], garbage, out[1]],
                                      [torch.full((3,), float("-inf")), lse[0], torch.full((3,), float("-inf")),
                                       lse[1]])
    alone, alone_lse = merge_by_lse(out, lse)
    assert torch.equal(merged, alone) and torch.equal(merged_lse, alone_lse)
    nothing, nothing_lse = merge_by_lse(torch.stack([garbage, garbage]), torch.full((2, 3), float("-inf")))
    assert torch.equal(nothing, torch.zeros(3, 8)) and torch.isneginf(nothing_lse).all()
    poisoned, _ = merge_by_lse(torch.stack([garbage, out[0]]), lse)   # a NaN in a part that counts propagates
    assert torch.isnan(poisoned).all()


def test_merge_by_lse_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="outs"):
        merge_by_lse(torch.zeros(2, 3, 8), torch.zeros(2, 4))
