"""custom_kernel(data): the leaderboard's calling convention on top of api.plan / DecodePlan.launch.

Every call validates what is free to read on the host (dtypes, shapes, devices, contiguity of the inputs it
uses, the config against the tensors, the plan's bounds): nothing an earlier call planned or cached skips that.
The first call with a layout also validates the indptr contents (one sync) and plans it (format and backend from
the planner, MLA_* env respected). Later calls with the same layout key are those checks, a lookup in a bounded
(LRU) cache of plans, and one backend call. The key holds everything a plan depends on that is free to read on
the host; the indptr contents are not in it and need not be: backends read them on the device, clamped, and
report bad ones at the next plan (validate.py), a plan fixes only launch geometry (docs/design.md#the-planrun-contract),
and the output is a new tensor each call.
"""
from collections import OrderedDict

import torch

from . import api
from .constants import V_HEAD_DIM
from .validate import check_inputs, checked_segment_lengths

# Layouts kept planned at once: a serving load (total_q changes every step) replans the oldest, never grows
# without bound; each plan holds its backend's workspace, freed when it leaves.
MAX_PLANNED_LAYOUTS = 64
_plans = OrderedDict()  # layout key -> DecodePlan, least recently used first


def custom_kernel(data):
    q, kv_data, qo_indptr, kv_indptr, config = data
    batch, num_heads, q_shape = config["batch_size"], config["num_heads"], q.shape
    if len(q_shape) != 3 or q_shape[1] != num_heads or qo_indptr.shape[0] != batch + 1:
        raise ValueError(f"config says batch {batch} with {num_heads} heads; the tensors have q of shape "
                         f"{tuple(q_shape)} and batch {qo_indptr.shape[0] - 1}")
    # The plan for a key was made from tensors with exactly these shapes, device and config: its own bounds
    # (heads, query rows, device, batch) hold for every call that finds it. What the key leaves out is checked below.
    key = (batch, config["q_seq_len"], config["kv_seq_len"], num_heads, q_shape, kv_data["bf16"].shape, q.device,
           config["sm_scale"])
    planned = _plans.get(key)
    if planned is None:
        planned = _plan_layout(q, kv_data, qo_indptr, kv_indptr, config["sm_scale"])
        _plans[key] = planned
        if len(_plans) > MAX_PLANNED_LAYOUTS:
            _plans.popitem(last=False)
    else:
        _plans.move_to_end(key)
    kv_cache = kv_data[planned.kv_format]
    check_inputs(q, kv_cache, planned.kv_format, qo_indptr, kv_indptr)
    out = torch.empty(q_shape[0], num_heads, V_HEAD_DIM, dtype=torch.bfloat16, device=q.device)
    planned.launch(q, kv_cache, qo_indptr, kv_indptr, out, config["sm_scale"])
    return out


def _plan_layout(q, kv_data, qo_indptr, kv_indptr, sm_scale):
    """Validate a first-seen layout in full and plan it for the lengths its indptr arrays actually hold and the
    config's sm_scale (the self-check's)."""
    for kv_format, kv_cache in kv_data.items():
        num_kv_rows = check_inputs(q, kv_cache, kv_format, qo_indptr, kv_indptr)
    max_q_len, max_kv_len, kv_lens = checked_segment_lengths(qo_indptr, kv_indptr, q.shape[0], num_kv_rows)
    return api.plan(qo_indptr, kv_indptr, num_heads=q.shape[1], device=q.device, max_q_len=max_q_len,
                    max_kv_len=max_kv_len, kv_lens=kv_lens, sm_scale=sm_scale)
