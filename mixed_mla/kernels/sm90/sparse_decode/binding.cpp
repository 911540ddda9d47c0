// torch binding of the sm_90a sparse decode: fills SparseParams from the tensors and launches on the current stream.
// No allocation and no device sync: the plan passes its split workspace; mixed_mla.sparse has validated the inputs.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

#include "config.h"           // sm90/decode/: the row format
#include "decode_binding.h"   // kernels/common/: fill_query_params, bytes_of
#include "launch.h"

// q (total_q, H, 576) bf16, last dim contiguous; kv (num_pages, page_size, 656) one-byte elements (fp8_ds_mla rows),
// rows 16-byte aligned, any page stride; indices (total_q, topk) int32, last dim contiguous; topk_length (total_q,)
// int32 and attn_sink (H,) float32, empty for none; out (total_q, H, 512) bf16; lse (total_q, H) float32 contiguous,
// empty for none; partial_out / partial_lse the split workspace (bf16 >= total_q*H*splits*512, fp32 >=
// total_q*H*splits), read when num_splits > 1; tiles_per_split: each split's share of the top-k list in 64-row tiles.
void forward(const torch::Tensor& q, const torch::Tensor& kv, const torch::Tensor& indices,
             const torch::Tensor& topk_length, const torch::Tensor& attn_sink, const torch::Tensor& out,
             const torch::Tensor& lse, const torch::Tensor& partial_out, const torch::Tensor& partial_lse,
             int64_t num_splits, int64_t tiles_per_split, double sm_scale) {
  const auto device = q.device();
  TORCH_CHECK(q.is_cuda() && kv.device() == device && indices.device() == device && out.device() == device,
              "tensors on one GPU");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && q.dim() == 3 && q.size(2) == 576 && q.stride(2) == 1,
              "q must be (total_q, H, 576) bf16 with a contiguous last dim");
  TORCH_CHECK(out.scalar_type() == at::kBFloat16 && out.dim() == 3 && out.size(0) == q.size(0) &&
              out.size(1) == q.size(1) && out.size(2) == 512 && out.stride(2) == 1,
              "out must be (total_q, H, 512) bf16 with a contiguous last dim");
  TORCH_CHECK(kv.dim() == 3 && kv.element_size() == 1 && kv.size(2) == mla_sm90::kDsMlaRowBytes && kv.stride(2) == 1 &&
              kv.stride(0) % 16 == 0 && kv.stride(1) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(kv.data_ptr()) % 16 == 0,
              "kv must be (num_pages, page_size, 656) bytes with 16-byte aligned rows");
  TORCH_CHECK(indices.scalar_type() == at::kInt && indices.dim() == 2 && indices.size(0) == q.size(0) &&
              indices.size(1) >= 1 && indices.stride(1) == 1, "indices must be (total_q, topk) int32");
  if (topk_length.numel() > 0)
    TORCH_CHECK(topk_length.scalar_type() == at::kInt && topk_length.numel() == q.size(0) &&
                topk_length.is_contiguous() && topk_length.device() == device, "topk_length must be (total_q,) int32");
  if (attn_sink.numel() > 0)
    TORCH_CHECK(attn_sink.scalar_type() == at::kFloat && attn_sink.numel() == q.size(1) &&
                attn_sink.is_contiguous() && attn_sink.device() == device, "attn_sink must be (H,) float32");
  if (lse.numel() > 0)
    TORCH_CHECK(lse.scalar_type() == at::kFloat && lse.dim() == 2 && lse.size(0) == q.size(0) &&
                lse.size(1) == q.size(1) && lse.is_contiguous() && lse.device() == device,
                "lse must be float32 (total_q, H), contiguous, on q's device");
  if (num_splits > 1)
    TORCH_CHECK(partial_out.scalar_type() == at::kBFloat16 && partial_lse.scalar_type() == at::kFloat &&
                partial_out.numel() >= q.size(0) * q.size(1) * num_splits * 512 &&
                partial_lse.numel() >= q.size(0) * q.size(1) * num_splits, "split workspace too small");
  TORCH_CHECK(kv.numel() == 0 || kv.size(0) * kv.size(1) < (int64_t{1} << 31), "at most 2^31 - 1 cache slots");

  mla_sm90::SparseParams p{};
  mla_binding::fill_query_params(p, q, out, partial_out, partial_lse, num_splits, sm_scale);
  p.kv = mla_binding::bytes_of(kv);
  p.indices = indices.data_ptr<int32_t>();
  p.topk_length = topk_length.numel() > 0 ? topk_length.data_ptr<int32_t>() : nullptr;
  p.attn_sink = attn_sink.numel() > 0 ? attn_sink.data_ptr<float>() : nullptr;
  p.lse = lse.numel() > 0 ? lse.data_ptr<float>() : nullptr;
  p.indices_row_stride = indices.stride(0);
  p.page_stride = kv.stride(0);
  p.row_stride = kv.stride(1);
  p.topk = static_cast<int>(indices.size(1));
  p.page_size = static_cast<int>(kv.size(1));
  p.num_slots = static_cast<int>(kv.size(0) * kv.size(1));
  p.tiles_per_split = static_cast<int>(tiles_per_split);
  const int err = mla_sm90_sparse_decode(&p, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == 0, "cuda_sm90 sparse decode launch failed with cudaError ", err);
}
