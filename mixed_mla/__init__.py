"""mixed-mla: MLA decode (DeepSeek absorbed form) over bf16 / fp8 / mxfp4 KV caches."""

from .api import DecodePlan, decode, plan, workspace_bytes  # noqa: F401  (the contiguous cache API; the workspace)
from .paged import PagedDecodePlan, decode_paged, plan_paged  # noqa: F401  (the paged cache API)
from .append import append_paged  # noqa: F401  (writing new tokens' rows into a paged cache)
from .context_parallel import decode_context_parallel, merge_across_ranks, merge_by_lse  # noqa: F401  (over ranks)
