// torch binding of the sm_90a decode: fills DecodeParams from the tensors and launches on the current stream.
// One call per forward, no allocation: the backend passes the cached split workspace. The checks here cost no
// device sync; the Python side has already validated shapes and dtypes (mixed_mla.validate).
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

#include "decode_binding.h"   // kernels/common/
#include "launch.h"

using mla_binding::bytes_of;

// kv_format: 0 bf16 (kv (N, 1, 576) bf16), 1 fp8 (kv (N, 1, 576) 1-byte, kv_aux float32 (1,) scale),
// 2 mxfp4 (kv (N, 1, 288) 1-byte, kv_aux 1-byte (>= N, 24) e8m0 scales), 3 fp8_ds_mla (kv (N, 1, 656) 1-byte, its
// scales inside the rows; kv_aux unused). partial_out (>= total_q*H*splits*512) bf16 and partial_lse
// (>= total_q*H*splits) fp32 are read only when num_splits > 1. variant: fp8 0 32-token tiles,
// 1 64-token tiles (config.h Fp8Variant); mxfp4 0 expanded tiles, 1 warpgroup MMA (Mxfp4Variant); bf16 ignores it.
// error_flag: int32 (2,) on the device, where the kernel records indptr contents that break the layout rules
// (mixed_mla.validate raises them).
// Paged caches: block_table (batch, max_pages) int32 with contiguous rows and seq_lens (batch,) int32, both non-empty;
// kv is then (num_pages, page_size, row) contiguous (kv_aux (num_pages, page_size, 24) for mxfp4), kv_indptr unused
// (pass qo_indptr), the fp8 variant may also be 2 (row-by-row tiles for pages that hold no whole tile). Empty tensors:
// a contiguous cache.
// lse: float32 (total_q, H) contiguous, the natural-log LSE of every row and head; empty: not written.
// split_tokens: 0, each row cut into num_splits equal shares; > 0, into shares of that many rows (params.h), the
// batch-invariant plans' cut.
void forward(const torch::Tensor& q, const torch::Tensor& kv, const torch::Tensor& kv_aux,
             const torch::Tensor& qo_indptr, const torch::Tensor& kv_indptr, const torch::Tensor& out,
             const torch::Tensor& partial_out, const torch::Tensor& partial_lse, const torch::Tensor& error_flag,
             int64_t kv_format, int64_t variant, int64_t num_splits, int64_t max_q_len, double sm_scale,
             const torch::Tensor& block_table, const torch::Tensor& seq_lens, const torch::Tensor& lse,
             int64_t split_tokens) {
  const bool paged = block_table.numel() > 0;
  TORCH_CHECK(q.is_cuda() && kv.device() == q.device() && out.device() == q.device(), "tensors on one GPU");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && q.dim() == 3 && q.size(2) == 576 && q.stride(2) == 1,
              "q must be (total_q, H, 576) bf16 with a contiguous last dim");
  TORCH_CHECK(out.scalar_type() == at::kBFloat16 && out.size(0) == q.size(0) && out.size(1) == q.size(1) &&
              out.size(2) == 512 && out.stride(2) == 1, "out must be (total_q, H, 512) bf16");
  const int64_t row_bytes = kv_format == 3 ? 656 : kv_format == 2 ? 288 : kv_format == 1 ? 576 : 1152;
  TORCH_CHECK(kv.dim() == 3 && (paged ? kv.is_contiguous() : kv.size(1) == 1) &&
              kv.size(2) * kv.element_size() == row_bytes &&
              kv.stride(2) == 1 && (kv.stride(0) * kv.element_size()) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(kv.data_ptr()) % 16 == 0, "kv rows must be 16-byte aligned");
  if (kv_format == 1) {
    TORCH_CHECK(kv_aux.scalar_type() == at::kFloat && kv_aux.numel() == 1, "fp8 scale must be float32 (1,)");
  } else if (kv_format == 2) {
    if (paged) {
      TORCH_CHECK(kv_aux.element_size() == 1 && kv_aux.dim() == 3 && kv_aux.size(0) == kv.size(0) &&
                  kv_aux.size(1) == kv.size(1) && kv_aux.size(2) == 24 && kv_aux.is_contiguous(),
                  "paged mxfp4 scales must be contiguous bytes (num_pages, page_size, 24)");
    } else {
      TORCH_CHECK(kv_aux.element_size() == 1 && kv_aux.dim() == 2 && kv_aux.size(0) >= kv.size(0) &&
                  kv_aux.size(1) == 24 && kv_aux.is_contiguous(), "mxfp4 scales must be contiguous bytes (>= N, 24)");
    }
  }
  TORCH_CHECK(qo_indptr.scalar_type() == at::kInt && kv_indptr.scalar_type() == at::kInt &&
              qo_indptr.numel() == kv_indptr.numel() && qo_indptr.numel() >= 1, "indptr must be int32 (batch + 1,)");
  TORCH_CHECK(error_flag.scalar_type() == at::kInt && error_flag.numel() == 2 && error_flag.device() == q.device(),
              "error_flag must be int32 (2,) on q's device");
  if (num_splits > 1) {
    TORCH_CHECK(partial_out.scalar_type() == at::kBFloat16 && partial_lse.scalar_type() == at::kFloat &&
                partial_out.numel() >= q.size(0) * q.size(1) * num_splits * 512 &&
                partial_lse.numel() >= q.size(0) * q.size(1) * num_splits, "split workspace too small");
  }

  TORCH_CHECK(split_tokens >= 0 && split_tokens <= (1 << 24), "split_tokens must be in 0..2^24");
  if (lse.numel() > 0) {
    TORCH_CHECK(lse.scalar_type() == at::kFloat && lse.dim() == 2 && lse.size(0) == q.size(0) &&
                lse.size(1) == q.size(1) && lse.is_contiguous() && lse.device() == q.device(),
                "lse must be float32 (total_q, H), contiguous, on q's device");
  }

  mla_sm90::DecodeParams p{};
  mla_binding::fill_common_params(p, q, kv, qo_indptr, kv_indptr, out, partial_out, partial_lse, error_flag, num_splits,
                                  sm_scale);
  p.kv_block_scales = kv_format == 2 ? bytes_of(kv_aux) : nullptr;
  p.kv_scale = kv_format == 1 ? kv_aux.data_ptr<float>() : nullptr;
  p.kv_row_stride = kv.stride(0) * kv.element_size();
  p.num_kv_rows = static_cast<int>(kv.size(0));
  p.max_q_len = static_cast<int>(max_q_len);
  p.split_tokens = static_cast<int>(split_tokens);
  p.lse = lse.numel() > 0 ? lse.data_ptr<float>() : nullptr;
  if (paged) {
    TORCH_CHECK(block_table.scalar_type() == at::kInt && block_table.dim() == 2 && block_table.stride(1) == 1 &&
                block_table.size(0) == qo_indptr.numel() - 1 && seq_lens.scalar_type() == at::kInt &&
                seq_lens.numel() == block_table.size(0) && seq_lens.is_contiguous() &&
                block_table.device() == q.device() && seq_lens.device() == q.device(),
                "block_table must be int32 (batch, max_pages) with contiguous rows, seq_lens int32 (batch,)");
    p.kv_indptr = nullptr;
    p.block_table = block_table.data_ptr<int32_t>();
    p.seq_lens = seq_lens.data_ptr<int32_t>();
    p.block_table_stride = block_table.stride(0);
    p.page_size = static_cast<int>(kv.size(1));
    p.max_pages = static_cast<int>(block_table.size(1));
    p.num_pages = static_cast<int>(kv.size(0));
    p.num_kv_rows = static_cast<int>(kv.size(0) * kv.size(1));   // flat rows: what the fp8 tensor map spans
    p.kv_row_stride = kv.stride(1) * kv.element_size();            // rows within a page, pages back to back
  }
  const int err = mla_sm90_decode(&p, static_cast<int>(kv_format), static_cast<int>(variant),
                                  c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == 0, "cuda_sm90 decode launch failed with cudaError ", err);
}
