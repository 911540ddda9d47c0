"""The HBM floor of one decode: the fewest bytes a path must move, over the device's copy bandwidth.

Bytes counted: every KV row of the format read once, Q read once, the bf16 output written once, the two indptr
arrays. Scratch traffic (split partials, the merge) is the kernel's own cost, so it is not in the floor.
"""
import torch

from mixed_mla.constants import MXFP4_BLOCKS_PER_ROW, MXFP4_PACKED_ROW_BYTES, QK_HEAD_DIM, V_HEAD_DIM

from .timing import KernelTimer

BF16_BYTES = 2
INDPTR_BYTES = 4
# Bytes of one cache row per format: bf16 1152, fp8 576, mxfp4 288 codes + 18 e8m0 scales = 306 (the scale
# tensor's padding columns are never read). The fp8 scale is one float32 for the whole cache.
KV_ROW_BYTES = {"bf16": QK_HEAD_DIM * BF16_BYTES, "fp8": QK_HEAD_DIM,
                "mxfp4": MXFP4_PACKED_ROW_BYTES + MXFP4_BLOCKS_PER_ROW}
FP8_SCALE_BYTES = 4

# The H200 of this project, measured with a torch copy and a read-reduce of 1-1.5 GB (docs/problem.md#hardware); the
# bench measures its own device at the start of each run and uses this only as the reference it prints beside it.
H200_MEASURED_TBPS = 4.25
H200_BYTES_PER_S = H200_MEASURED_TBPS * 1e12
# Bytes moved per timed copy (read + write): 2 GiB on a GPU, ~35x the H200's 60 MB L2 so the cache cannot serve
# it; 128 MiB on a CPU, where the floor only matters for the smoke test.
_COPY_BYTES = {"cuda": 1 << 31, "cpu": 1 << 27}


def cache_bytes(cache_rows: int, kv_format: str) -> int:
    """Bytes of `cache_rows` rows of a cache in kv_format, read once (with the fp8 cache's one scale)."""
    return cache_rows * KV_ROW_BYTES[kv_format] + (FP8_SCALE_BYTES if kv_format == "fp8" else 0)


def path_bytes(shape, kv_format: str) -> int:
    """Bytes a decode of `shape` (shapes.Shape) over a kv_format cache must move at least."""
    total_q = shape.batch * shape.q_len
    queries = total_q * shape.num_heads * QK_HEAD_DIM * BF16_BYTES
    output = total_q * shape.num_heads * V_HEAD_DIM * BF16_BYTES
    return cache_bytes(shape.cache_rows, kv_format) + queries + output + 2 * (shape.batch + 1) * INDPTR_BYTES


def floor_us(num_bytes: int, bytes_per_s: float = H200_BYTES_PER_S) -> float:
    return num_bytes / bytes_per_s * 1e6


def measure_copy_bandwidth(device, timer=None) -> float:
    """Copy bandwidth in bytes/s (read + write counted): the median time of copies of a random buffer, timed
    by `timer` (a timing.KernelTimer on `device`, made here when not given)."""
    device = torch.device(device)
    source = torch.empty(_COPY_BYTES.get(device.type, _COPY_BYTES["cpu"]) // 2, dtype=torch.uint8,
                         device=device).random_(0, 256)
    target = torch.empty_like(source)
    timing = (timer or KernelTimer(device)).measure(lambda _: target.copy_(source), 1)
    return 2 * source.numel() / (timing.median_us * 1e-6)
