"""FlashMLA's dense Hopper decode (deepseek-ai/FlashMLA `flash_mla_with_kvcache`, sm90), bf16 KV, page size 64.

Called as FlashMLA's README does: `get_mla_metadata()` once per batch layout, whose schedule the first call fills
in (done here, untimed), then `flash_mla_with_kvcache` per step. The timed call is that Python function: its
checks, its output and split buffers (allocated per call), the split kernel and the combine kernel. How the
package reaches the GPU machine (the dense decode only, built ahead for sm_90a): stage_flashmla.sh.
"""
from pathlib import Path

from mixed_mla.constants import DEFAULT_SM_SCALE, V_HEAD_DIM

from .flashmla_pages import as_pages, batched_queries, keep_output, paged_view, unavailable

NAME = "FlashMLA dense"
STAGED_FROM = "STAGED_FROM"   # the file stage_flashmla.sh writes into the package: repository@commit


def version():
    try:
        import flash_mla
    except Exception as error:  # any import failure is a reason to report, not to crash the benchmark
        return f"not importable ({type(error).__name__}: {error})"
    staged = Path(flash_mla.__file__).parent / STAGED_FROM
    return staged.read_text().strip() if staged.exists() else flash_mla.__version__


def unavailable_reason(device, kv_format):
    if kv_format != "bf16":
        return (f"FlashMLA's dense decode reads bf16 (or fp16) caches only, not {kv_format}; its fp8 decodes "
                f"are sparse (656-byte rows, top-k indices)")
    return unavailable(device, NAME, _load)


def _load():
    import flash_mla
    return flash_mla


def prepare(sets, kv_format):
    """(run, note): run(i) decodes input set i; the schedule is made here by one untimed call."""
    import flash_mla

    view = paged_view(sets[0].shape, sets[0].q.device)
    schedule, _ = flash_mla.get_mla_metadata()
    queries = [batched_queries(inputs) for inputs in sets]
    caches = [as_pages(inputs.caches[kv_format]) for inputs in sets]

    def run(index):
        out, _ = flash_mla.flash_mla_with_kvcache(
            queries[index], caches[index], view.block_table, view.seqlens, V_HEAD_DIM, schedule,
            softmax_scale=DEFAULT_SM_SCALE, causal=view.causal)
        keep_output(sets[index], out)

    run(0)
    return run, "sm90 dense, page 64"
