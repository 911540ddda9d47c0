"""mixed-mla: MLA decode (DeepSeek absorbed form) over bf16 / fp8 / mxfp4 KV caches."""
