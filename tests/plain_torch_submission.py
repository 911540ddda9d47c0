"""A plain, correct torch submission (bf16 cache, float32 arithmetic) for exercising eval.py without the
library: tests copy it next to the harness files as `submission.py`. Not the project's kernel."""
import torch

V_DIM = 512


def custom_kernel(data):
    q, kv_data, qo_indptr, kv_indptr, config = data
    kv = kv_data["bf16"].reshape(kv_data["bf16"].shape[0], -1).to(torch.float32)
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    out = torch.zeros((q.shape[0], q.shape[1], V_DIM), dtype=torch.float32, device=q.device)
    for b in range(len(qo) - 1):
        queries = q[qo[b]:qo[b + 1]].to(torch.float32)          # (L, H, 576)
        keys = kv[kvp[b]:kvp[b + 1]]                             # (N, 576)
        num_q, num_kv = queries.shape[0], keys.shape[0]
        scores = torch.einsum("lhd,nd->lhn", queries, keys) * config["sm_scale"]
        last_visible = num_kv - num_q + torch.arange(num_q, device=q.device)
        hidden = torch.arange(num_kv, device=q.device)[None, :] > last_visible[:, None]
        scores = scores.masked_fill(hidden[:, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        out[qo[b]:qo[b + 1]] = torch.einsum("lhn,nd->lhd", probs, keys[:, :V_DIM])
    return out.to(torch.bfloat16)
