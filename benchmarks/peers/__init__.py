"""What the peers table compares: our decode paths, FlashInfer's MLA decode, FlashMLA's dense decode, vLLM's
dense fp8 FlashMLA decode and plain torch.

A peer module has NAME, `unavailable_reason(device, kv_format) -> str | None` and `prepare(sets, kv_format)`
(and BOUND_PATH where its strict bound is not the "peer" one):
given the rotated input sets of one shape (inputs.DecodeInputs), it does the untimed setup (plans, host scales)
and returns `(run, note)`: run(i) decodes set i into that set's output buffer and nothing else; note says in a
few words how (the plan, the backend) for the table. `ours` takes the backend name as one more argument.
"""
from dataclasses import dataclass
from typing import Callable

from mixed_mla.constants import KV_FORMATS

from . import flashinfer_mla, flashmla, ours, torch_plain, vllm_flashmla_fp8

# Our torch backend (the reference path, ~0.1 s a call at (256, 8192)) is timed on benchmark shapes up to
# (32, 8192) and (256, 1024) only, and not in the sweep.
TORCH_BACKEND_MAX_ROWS = 1 << 18
NO_ROW_LIMIT = 1 << 62
# The peers in table order; each lists every cache format (those it cannot read say why).
PEERS = (torch_plain, flashinfer_mla, flashmla, vllm_flashmla_fp8)
# The peers whose build is staged for the GPU machine: their version() (staged commit, or why not importable)
# goes into env.json and the table's header.
STAGED_PEERS = {"flashinfer": flashinfer_mla, "flashmla": flashmla, "vllm_flashmla": vllm_flashmla_fp8}


@dataclass(frozen=True)
class Implementation:
    label: str                  # e.g. "ours cuda_sm90", "FlashInfer fa3", "torch plain"
    kv_format: str
    ours: bool
    unavailable_reason: Callable    # (device) -> str | None
    prepare: Callable               # (input sets) -> (run, note)
    in_sweep: bool = True
    max_rows: int = NO_ROW_LIMIT    # larger shapes (batch * kv_len cache rows) are not timed
    path: str = "peer"              # its strict bound's path (mixed_mla.exact.STRICT_BOUND): our backend's name

    @property
    def name(self) -> str:
        return f"{self.label} {self.kv_format}"


def implementations(our_backends) -> list:
    """Each of our backends in every cache format, then each peer in every format (unavailable ones say why)."""
    found = []
    for backend in our_backends:
        for kv_format in KV_FORMATS:
            found.append(Implementation(
                f"{ours.NAME} {backend}", kv_format, True,
                lambda device, f=kv_format, b=backend: ours.unavailable_reason(device, f, b),
                lambda sets, f=kv_format, b=backend: ours.prepare(sets, f, b),
                in_sweep=backend != "torch", max_rows=TORCH_BACKEND_MAX_ROWS if backend == "torch" else NO_ROW_LIMIT,
                path=backend))
    # Foreign kernels last: a fault in a peer's kernel would poison the CUDA context for whatever runs after it.
    for peer in PEERS:
        for kv_format in KV_FORMATS:
            found.append(Implementation(
                peer.NAME, kv_format, False,
                lambda device, f=kv_format, p=peer: p.unavailable_reason(device, f),
                lambda sets, f=kv_format, p=peer: p.prepare(sets, f), path=getattr(peer, "BOUND_PATH", "peer")))
    return found
