"""FlashInfer's MLA decode (`BatchMLAPagedAttentionWrapper`, its Hopper "fa3" backend), page size 1.

The wrapper is planned once per batch layout, as FlashInfer intends; the timed call is `run` alone. Its fp8 path
(fa3 only) reads an e4m3 cache with a per-tensor scale given as a host float, the same cache our fp8 path reads.
How the package reaches the GPU machine (trimmed, with the two MLA modules compiled ahead): stage_flashinfer.sh.
"""
import torch

from mixed_mla.constants import DEFAULT_SM_SCALE, KV_LORA_RANK, QK_ROPE_HEAD_DIM

NAME = "FlashInfer fa3"
BACKEND = "fa3"
# FlashInfer's documented starting size for the wrapper's float workspace (split partials).
_WORKSPACE_BYTES = 128 << 20
_KV_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


def version():
    try:
        import flashinfer
    except Exception as error:  # any import failure is a reason to report, not to crash the benchmark
        return f"not importable ({type(error).__name__}: {error})"
    return flashinfer.__version__


def unavailable_reason(device, kv_format):
    if kv_format not in _KV_DTYPES:
        return f"FlashInfer has no {kv_format} MLA decode (its MLA KV dtypes: bf16, fp16, fp8 e4m3)"
    device = torch.device(device)
    if device.type != "cuda" or torch.version.cuda is None:
        return "FlashInfer runs on NVIDIA GPUs only"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        return f"the {BACKEND} backend needs sm_90 (Hopper); this GPU is sm_{major}{minor}"
    try:
        import flashinfer.mla  # noqa: F401
    except Exception as error:
        return f"flashinfer is not importable: {type(error).__name__}: {error}"
    return None


def prepare(sets, kv_format):
    """(run, note): run(i) decodes input set i into its output buffer; planning and fp8 scales happen here."""
    import flashinfer.mla as mla

    shape, first = sets[0].shape, sets[0]
    device = first.q.device
    workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    wrapper = mla.BatchMLAPagedAttentionWrapper(workspace, backend=BACKEND)
    # Page size 1: page i is cache row i, so the page list is every row in order.
    metadata = mla.MLAPlanMetadata.csr(
        qo_indptr=first.qo_indptr, kv_indptr=first.kv_indptr,
        kv_indices=torch.arange(shape.batch * shape.kv_len, dtype=torch.int32, device=device),
        kv_len_arr=first.kv_indptr.diff().to(torch.int32))
    wrapper.plan(metadata=metadata, num_heads=shape.num_heads, head_dim_ckv=KV_LORA_RANK,
                 head_dim_kpe=QK_ROPE_HEAD_DIM, page_size=1, causal=True, sm_scale=DEFAULT_SM_SCALE,
                 q_data_type=torch.bfloat16, kv_data_type=_KV_DTYPES[kv_format],
                 scale_mode="kv-per-tensor" if kv_format == "fp8" else "default")
    note = f"{BACKEND}, page 1"

    if kv_format == "fp8":
        # FlashInfer takes the per-tensor scale as a host float: read once per set here, outside the timed call.
        host_scales = [float(s.caches["fp8"][1].item()) for s in sets]

        def run(index):
            inputs = sets[index]
            wrapper.run(query=inputs.q, kv_cache=inputs.caches["fp8"][0], out=inputs.out,
                        ckv_scale=host_scales[index], kpe_scale=host_scales[index])
        return run, note

    def run(index):
        inputs = sets[index]
        wrapper.run(query=inputs.q, kv_cache=inputs.caches["bf16"], out=inputs.out)
    return run, note
