"""mixed-mla: MLA decode (DeepSeek absorbed form) over bf16 / fp8 / mxfp4 KV caches."""

from .paged import PagedDecodePlan, decode_paged, plan_paged  # noqa: E402,F401  (the paged cache API)
