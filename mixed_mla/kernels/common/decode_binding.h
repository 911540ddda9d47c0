// What every arch's torch binding (sm90/decode/binding.cpp, gfx950/decode/binding.cpp) copies the same way from the
// tensors into its own DecodeParams: the pointers of q, the cache rows, both indptr arrays, the output, the split
// workspace and the device error flag, the q and output strides, the sizes and the scale. Each arch's params.h
// names these fields alike; the binding sets its own fields (scales, row strides, paging) after this. Host code.
#pragma once
#include <torch/extension.h>

namespace mla_binding {

inline const uint8_t* bytes_of(const torch::Tensor& t) { return static_cast<const uint8_t*>(t.data_ptr()); }

// The kernels take exp2 arguments: scores are scaled by sm_scale * log2(e) once, here.
constexpr double kLog2e = 1.4426950408889634;

// The query side, which the sparse decode's binding (sm90/sparse_decode/binding.cpp) sets alike too: q, the output,
// the split workspace, their strides, the sizes and the scale.
template <class Params>
void fill_query_params(Params& p, const torch::Tensor& q, const torch::Tensor& out, const torch::Tensor& partial_out,
                       const torch::Tensor& partial_lse, int64_t num_splits, double sm_scale) {
  p.q = static_cast<const uint16_t*>(q.data_ptr());
  p.out = static_cast<uint16_t*>(out.data_ptr());
  p.partial_out = num_splits > 1 ? static_cast<uint16_t*>(partial_out.data_ptr()) : nullptr;
  p.partial_lse = num_splits > 1 ? partial_lse.data_ptr<float>() : nullptr;
  p.q_row_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.out_row_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.total_q = static_cast<int>(q.size(0));
  p.num_heads = static_cast<int>(q.size(1));
  p.num_splits = static_cast<int>(num_splits);
  p.sm_scale_log2 = static_cast<float>(sm_scale * kLog2e);
}

template <class Params>
void fill_common_params(Params& p, const torch::Tensor& q, const torch::Tensor& kv, const torch::Tensor& qo_indptr,
                        const torch::Tensor& kv_indptr, const torch::Tensor& out, const torch::Tensor& partial_out,
                        const torch::Tensor& partial_lse, const torch::Tensor& error_flag, int64_t num_splits,
                        double sm_scale) {
  fill_query_params(p, q, out, partial_out, partial_lse, num_splits, sm_scale);
  p.kv = bytes_of(kv);
  p.qo_indptr = qo_indptr.data_ptr<int32_t>();
  p.kv_indptr = kv_indptr.data_ptr<int32_t>();
  p.error_flag = error_flag.data_ptr<int32_t>();
  p.batch = static_cast<int>(qo_indptr.numel() - 1);
}

}  // namespace mla_binding
