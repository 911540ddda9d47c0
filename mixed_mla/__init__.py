"""mixed-mla: MLA decode (DeepSeek absorbed form) over bf16 / fp8 / mxfp4 / fp8_ds_mla KV caches, dense or sparse."""

from .api import DecodePlan, decode, plan, workspace_bytes  # noqa: F401  (the contiguous cache API; the workspace)
from .paged import PagedDecodePlan, decode_paged, plan_paged  # noqa: F401  (the paged cache API)
from .append import append_paged, concat_and_cache_mla  # noqa: F401  (writing new tokens' rows into a paged cache)
from .kernels import build_info  # noqa: F401  (what the install holds: kernels built ahead of time or JIT)
from .sparse import SparseDecodePlan, decode_sparse, plan_sparse  # noqa: F401  (sparse top-k decode, DeepSeek-V3.2)
from .context_parallel import decode_context_parallel, merge_across_ranks, merge_by_lse  # noqa: F401  (over ranks)
