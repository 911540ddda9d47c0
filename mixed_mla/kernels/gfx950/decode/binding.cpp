// torch binding of the gfx950 decode (ROCm torch, load_inline): checks the tensors, fills DecodeParams,
// launches on the current stream. One call per forward; no allocation (the backend passes the split buffers).
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

#include "config.h"
#include "decode_binding.h"   // kernels/common/
#include "params.h"

namespace mla_gfx950 {
int launch_decode(const DecodeParams& p, int format, int occupancy, bool fused, bool gather, void* stream);
int launch_indptr_guard(const IndptrGuardParams& p, void* stream);
}

using mla_binding::bytes_of;

// kv_format: a config.h KvFormat code (constants.KV_FORMAT_CODES): kFormatFp8 (kv = e4m3 rows (N, 576) as bytes,
// kv_aux = float32 scale (1,)) or kFormatMxfp4 (kv = packed rows (N, 288) as bytes, kv_aux = e8m0 scales (>= N, 24)
// as bytes). partial_out (total_q, H, splits, 512) bf16 and partial_lse (total_q, H, splits) float32 are only
// touched when num_splits > 1. error_flag: int32 (2,), the device's indptr violation flag (validate.py).
// arrivals: int32 (>= total_q * H / 16,), zero, for a fused kernel with num_splits > 1 (left zero after the call);
// lse: None, or float32 (total_q, H) contiguous, receiving the natural-log log-sum-exp of every row and head.
// block_table (batch, max_pages) int32 with contiguous rows and seq_lens (batch,) int32: the gather form (params.h:
// a page-size-1 block table; kv_indptr is then unused, occupancy 3, not fused); both empty: the dense form.
void forward(torch::Tensor q, torch::Tensor kv, torch::Tensor kv_aux, torch::Tensor qo_indptr,
             torch::Tensor kv_indptr, torch::Tensor out, torch::Tensor partial_out, torch::Tensor partial_lse,
             torch::Tensor error_flag, torch::Tensor arrivals, c10::optional<torch::Tensor> lse, int64_t num_splits,
             int64_t occupancy, bool fused, int64_t kv_format, double sm_scale, torch::Tensor block_table,
             torch::Tensor seq_lens) {
  const bool fp8 = kv_format == mla_gfx950::kFormatFp8;
  TORCH_CHECK(fp8 || kv_format == mla_gfx950::kFormatMxfp4, "hip_gfx950 reads fp8 (", mla_gfx950::kFormatFp8,
              ") or mxfp4 (", mla_gfx950::kFormatMxfp4, ") caches, got format code ", kv_format);
  TORCH_CHECK(q.is_cuda() && kv.device() == q.device() && out.device() == q.device(), "tensors on one GPU");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && q.dim() == 3 && q.size(2) == 576 && q.stride(2) == 1,
              "q must be (total_q, H, 576) bf16 with a contiguous last dim");
  TORCH_CHECK(q.size(1) % 16 == 0, "num_heads must be a multiple of 16");
  TORCH_CHECK(out.scalar_type() == at::kBFloat16 && out.size(0) == q.size(0) && out.size(1) == q.size(1) &&
              out.size(2) == 512 && out.stride(2) == 1, "out must be (total_q, H, 512) bf16");
  TORCH_CHECK(kv.scalar_type() == at::kByte && kv.is_contiguous() && kv.size(-1) == (fp8 ? 576 : 288),
              "kv must be contiguous byte rows of ", fp8 ? 576 : 288);
  TORCH_CHECK(qo_indptr.scalar_type() == at::kInt && kv_indptr.scalar_type() == at::kInt &&
              qo_indptr.numel() == kv_indptr.numel() && qo_indptr.numel() >= 1 &&
              qo_indptr.is_contiguous() && kv_indptr.is_contiguous(), "indptr must be int32 (batch + 1,)");
  TORCH_CHECK(error_flag.scalar_type() == at::kInt && error_flag.numel() == 2 && error_flag.is_contiguous() &&
              error_flag.device() == q.device(), "error_flag must be int32 (2,) on q's device");
  TORCH_CHECK(num_splits >= 1 && occupancy >= 2 && occupancy <= 4, "bad num_splits / occupancy");
  TORCH_CHECK(!fused || fp8, "the fused kernels read fp8 caches only");
  if (fused && num_splits > 1)
    TORCH_CHECK(arrivals.scalar_type() == at::kInt && arrivals.is_contiguous() && arrivals.device() == q.device() &&
                arrivals.numel() >= q.size(0) * (q.size(1) / 16), "arrivals must be int32 (>= total_q * H / 16,) "
                "on q's device");
  if (lse.has_value())
    TORCH_CHECK(lse->scalar_type() == at::kFloat && lse->is_contiguous() && lse->device() == q.device() &&
                lse->dim() == 2 && lse->size(0) == q.size(0) && lse->size(1) == q.size(1),
                "lse must be float32 (total_q, H), contiguous, on q's device");
  const int64_t num_rows = kv.numel() / (fp8 ? 576 : 288);
  const bool gather = block_table.numel() > 0;
  if (gather)
    TORCH_CHECK(block_table.scalar_type() == at::kInt && block_table.dim() == 2 && block_table.stride(1) == 1 &&
                block_table.size(0) == qo_indptr.numel() - 1 && block_table.device() == q.device() &&
                seq_lens.scalar_type() == at::kInt && seq_lens.is_contiguous() && seq_lens.device() == q.device() &&
                seq_lens.numel() == block_table.size(0) && num_rows >= 1 && occupancy == 3 && !fused,
                "the gather form takes block_table (batch, max_pages) and seq_lens (batch,) int32 on q's device, "
                "a cache of >= 1 row, occupancy 3, not fused");
  if (fp8) {
    TORCH_CHECK(kv_aux.scalar_type() == at::kFloat && kv_aux.numel() == 1, "fp8 scale must be float32 (1,)");
  } else {
    TORCH_CHECK(kv_aux.scalar_type() == at::kByte && kv_aux.dim() == 2 && kv_aux.size(0) >= num_rows &&
                kv_aux.size(1) == 24 && kv_aux.is_contiguous(), "mxfp4 scales must be contiguous bytes (>= N, 24)");
  }
  if (num_splits > 1) {
    TORCH_CHECK(partial_out.scalar_type() == at::kBFloat16 && partial_out.is_contiguous() &&
                partial_out.numel() >= q.size(0) * q.size(1) * num_splits * 512, "partial_out too small");
    TORCH_CHECK(partial_lse.scalar_type() == at::kFloat && partial_lse.is_contiguous() &&
                partial_lse.numel() >= q.size(0) * q.size(1) * num_splits, "partial_lse too small");
  }
  // the kernels move q, kv and out in 16-byte vectors: every row and head must start 16-byte aligned
  auto aligned16 = [](const torch::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
  TORCH_CHECK(aligned16(q) && aligned16(out) && aligned16(kv) && q.stride(0) % 8 == 0 && q.stride(1) % 8 == 0 &&
              out.stride(0) % 8 == 0 && out.stride(1) % 8 == 0, "q, kv and out must be 16-byte aligned, with row "
              "and head strides that are multiples of 8 elements");
  if (q.size(0) == 0) return;

  mla_gfx950::DecodeParams p{};
  mla_binding::fill_common_params(p, q, kv, qo_indptr, kv_indptr, out, partial_out, partial_lse, error_flag, num_splits,
                                  sm_scale);
  p.kv_block_scales = fp8 ? nullptr : bytes_of(kv_aux);
  p.kv_scale = fp8 ? kv_aux.data_ptr<float>() : nullptr;
  p.num_kv_rows = (int)num_rows;
  p.lse = lse.has_value() ? lse->data_ptr<float>() : nullptr;
  p.arrivals = fused && num_splits > 1 ? arrivals.data_ptr<int32_t>() : nullptr;
  if (gather) {
    p.block_table = block_table.data_ptr<int32_t>();
    p.seq_lens = seq_lens.data_ptr<int32_t>();
    p.block_table_stride = block_table.stride(0);
    p.max_pages = (int)block_table.size(1);
  }
  const int err = mla_gfx950::launch_decode(p, (int)kv_format, (int)occupancy, fused, gather,
                                            c10::cuda::getCurrentCUDAStream(q.get_device()).stream());
  TORCH_CHECK(err == 0, "hip_gfx950 launch failed with hipError ", err);
}

// The aiter route's indptr guard (indptr_guard.hip): qo_out / kv_out (n,) int32 receive the clamped copies of
// qo_indptr / kv_indptr (n,) int32; changes are recorded in error_flag (2,) int32. One launch on the current stream.
void guard_indptr(torch::Tensor qo_indptr, torch::Tensor kv_indptr, torch::Tensor qo_out, torch::Tensor kv_out,
                  torch::Tensor error_flag, int64_t total_q, int64_t num_kv_rows) {
  const int64_t n = qo_indptr.numel();
  for (const torch::Tensor* t : {&qo_indptr, &kv_indptr, &qo_out, &kv_out, &error_flag})
    TORCH_CHECK(t->scalar_type() == at::kInt && t->is_contiguous() && t->device() == qo_indptr.device() &&
                t->is_cuda(), "indptr guard tensors must be contiguous int32 on one GPU");
  TORCH_CHECK(n >= 2 && kv_indptr.numel() == n && qo_out.numel() == n && kv_out.numel() == n &&
              error_flag.numel() == 2, "indptr guard: (batch + 1,) arrays and a (2,) flag");
  mla_gfx950::IndptrGuardParams p{};
  p.qo_indptr = qo_indptr.data_ptr<int32_t>();
  p.kv_indptr = kv_indptr.data_ptr<int32_t>();
  p.qo_out = qo_out.data_ptr<int32_t>();
  p.kv_out = kv_out.data_ptr<int32_t>();
  p.error_flag = error_flag.data_ptr<int32_t>();
  p.n = (int)n;
  p.total_q = (int)total_q;
  p.num_kv_rows = (int)num_kv_rows;
  const int err = mla_gfx950::launch_indptr_guard(p, c10::cuda::getCurrentCUDAStream(qo_indptr.get_device()).stream());
  TORCH_CHECK(err == 0, "hip_gfx950 indptr guard launch failed with hipError ", err);
}
