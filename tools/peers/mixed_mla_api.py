"""Our decode through the public API, as a user calls it: `mixed_mla.api.plan(...)` once per layout, then
`.run(...)` per step.

The backend is forced (plan(..., backend=name)) so that each row of the table is the path it names, never a
silent fallback to another backend.
"""
import torch

from mixed_mla import api, backends

NAME = "ours"


def unavailable_reason(device, kv_format, backend):
    reason = backends.unavailable_reason(backend, str(torch.device(device)))
    if reason is None and not backends.supports(backend, kv_format, 16):
        reason = f"backend {backend} does not read {kv_format} caches"
    return reason


def prepare(sets, kv_format, backend):
    """(run, note): run(i) decodes input set i into its output buffer; note is the plan the API chose."""
    first = sets[0]
    shape = first.shape
    planned = api.plan(first.qo_indptr, first.kv_indptr, num_heads=shape.num_heads, device=first.q.device,
                       kv_format=kv_format, max_q_len=shape.q_len, max_kv_len=shape.kv_len, backend=backend)

    def run(index):
        inputs = sets[index]
        planned.run(inputs.q, inputs.caches[kv_format], inputs.qo_indptr, inputs.kv_indptr, out=inputs.out)

    plan = planned.plan
    note = f"splits {plan.num_splits}" + (f", {plan.variant}" if plan.variant else "") + f" ({plan.source})"
    return run, note
