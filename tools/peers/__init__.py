"""What the benchmark compares our decode with: one module per peer, plus the HBM floor.

A peer module has NAME, `unavailable_reason(device, kv_format) -> str | None` and `prepare(sets, kv_format)`:
given the rotated input sets of one shape (inputs.DecodeInputs), it does the untimed setup (plans, host scales)
and returns `(run, note)`: run(i) decodes set i into that set's output buffer and nothing else; note says in a
few words how (the plan, the backend) for the table.
"""
