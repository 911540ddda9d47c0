"""Types of the `amd-mixed-mla` problem: the names and shapes the leaderboard's task.py declares.

Input: (q, kv_data, qo_indptr, kv_indptr, config)
  q:          (total_q, num_heads, 576) bfloat16, the absorbed query
  kv_data:    the same cache in three formats
    "bf16":   Tensor (total_kv, 1, 576) bfloat16
    "fp8":    (Tensor (total_kv, 1, 576) float8_e4m3fn, scale Tensor (1,) float32)
    "mxfp4":  (Tensor (total_kv, 1, 288) float4_e2m1fn_x2, scales (ceil(total_kv/256)*256, 24) float8_e8m0fnu)
  qo_indptr:  (batch_size + 1,) int32
  kv_indptr:  (batch_size + 1,) int32
  config:     dict of MLA parameters (batch_size, num_heads, ..., sm_scale)
Output: (total_q, num_heads, 512) bfloat16.
"""
from typing import TypedDict, TypeVar

import torch

input_t = TypeVar("input_t", bound=tuple[torch.Tensor, dict, torch.Tensor, torch.Tensor, dict])
output_t = TypeVar("output_t", bound=torch.Tensor)


class TestSpec(TypedDict):
    """One line of a case file; eval.py checks keys and value types against these annotations."""
    batchsize: int
    qseqlen: int
    kvseqlen: int
    seed: int
