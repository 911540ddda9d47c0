"""custom_kernel(data): the leaderboard's calling convention on top of api.plan / DecodePlan.launch.

The first call with a layout validates every input, indptr contents included (one sync), and plans it (format
and backend from the planner, MLA_* env respected). Later calls with the same layout key are a dictionary lookup
and one backend call. The key holds everything the cached plan depends on that is free to read on the host; the
indptr contents are not in it and need not be: backends read them on the device, a plan fixes only launch
geometry (DESIGN.md), and the output is a new tensor each call.
"""
import torch

from . import api
from .constants import V_HEAD_DIM
from .validate import check_indptr_contents, check_inputs, indptr_to_host, longest_segments

_plans = {}  # layout key -> DecodePlan


def custom_kernel(data):
    q, kv_data, qo_indptr, kv_indptr, config = data
    key = (config["batch_size"], config["q_seq_len"], config["kv_seq_len"], config["num_heads"],
           q.shape, kv_data["bf16"].shape, q.device)
    planned = _plans.get(key)
    if planned is None:
        planned = _plan_layout(q, kv_data, qo_indptr, kv_indptr, config)
        _plans[key] = planned
    out = torch.empty(q.shape[0], q.shape[1], V_HEAD_DIM, dtype=torch.bfloat16, device=q.device)
    planned.launch(q, kv_data[planned.kv_format], qo_indptr, kv_indptr, out, config["sm_scale"])
    return out


def _plan_layout(q, kv_data, qo_indptr, kv_indptr, config):
    """Validate a first-seen layout in full and plan it for the lengths its indptr arrays actually hold."""
    if q.shape[1] != config["num_heads"] or qo_indptr.shape[0] != config["batch_size"] + 1:
        raise ValueError(f"config says batch {config['batch_size']} with {config['num_heads']} heads; the tensors "
                         f"have batch {qo_indptr.shape[0] - 1} with {q.shape[1]} heads")
    for kv_format, kv_cache in kv_data.items():
        num_kv_rows = check_inputs(q, kv_cache, kv_format, qo_indptr, kv_indptr)
    qo_host, kv_host = indptr_to_host(qo_indptr, kv_indptr)
    check_indptr_contents(qo_host, kv_host, q.shape[0], num_kv_rows)
    max_q_len, max_kv_len = longest_segments(qo_host, kv_host)
    return api.plan(qo_indptr, kv_indptr, num_heads=q.shape[1], device=q.device, max_q_len=max_q_len,
                    max_kv_len=max_kv_len, kv_lens=[end - start for start, end in zip(kv_host, kv_host[1:])])
