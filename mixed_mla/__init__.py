"""mixed-mla: MLA decode (DeepSeek absorbed form) over bf16 / fp8 / mxfp4 KV caches."""

from .api import DecodePlan, decode, plan, workspace_bytes  # noqa: F401  (the contiguous cache API; the workspace)
from .paged import PagedDecodePlan, decode_paged, plan_paged  # noqa: F401  (the paged cache API)
from .append import append_paged, concat_and_cache_mla  # noqa: F401  (writing new tokens' rows into a paged cache)
from .kernels import build_info  # noqa: F401  (what the install holds: kernels built ahead of time or JIT)
