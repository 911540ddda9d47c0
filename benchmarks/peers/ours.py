"""Our decode through the public API, as a user calls it: `mixed_mla.api.plan(...)` once per layout, then
`.run(...)` per step.

The backend is forced (plan(..., backend=name)) so that each row of the table is the path it names, never a
silent fallback to another backend. `plan_for` also serves the autotuner and the sm90 probes, which swap in
the plan they time; it takes the `api` module to call, so a bundled submission.py's package serves as well.
"""
import dataclasses

import torch

from mixed_mla import api as shipped_api
from mixed_mla import backends

NAME = "ours"


def unavailable_reason(device, kv_format, backend):
    reason = backends.unavailable_reason(backend, str(torch.device(device)))
    if reason is None and not backends.supports(backend, kv_format, 16):
        reason = f"backend {backend} does not read {kv_format} caches"
    return reason


def plan_for(inputs, kv_format, backend, plan=None, api=shipped_api):
    """api.plan for the layout of `inputs` (a DecodeInputs), on `backend`; with `plan` (a planner.Plan) given,
    that plan is swapped in for the one the planner chose."""
    shape = inputs.shape
    planned = api.plan(inputs.qo_indptr, inputs.kv_indptr, num_heads=shape.num_heads, device=inputs.q.device,
                       kv_format=kv_format, max_q_len=shape.q_len, max_kv_len=shape.kv_len, backend=backend)
    return planned if plan is None else dataclasses.replace(planned, plan=plan)


def prepare(sets, kv_format, backend):
    """(run, note): run(i) decodes input set i into its output buffer; note is the plan the API chose."""
    planned = plan_for(sets[0], kv_format, backend)

    def run(index):
        inputs = sets[index]
        planned.run(inputs.q, inputs.caches[kv_format], inputs.qo_indptr, inputs.kv_indptr, out=inputs.out)

    plan = planned.plan
    note = f"splits {plan.num_splits}" + (f", {plan.variant}" if plan.variant else "") + f" ({plan.source})"
    return run, note
