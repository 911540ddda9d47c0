// The Python module `flash_mla_sparse.cuda`: FlashMLA's sm90 sparse fp8 decode (DeepSeek-V3.2's 656-byte rows) as a
// peer, for stage_flashmla.sh and benchmarks/sparse_decode.py. FlashMLA's own entry point (csrc/api/sparse_decode.h)
// dispatches to its sm100 kernels too, whose sources the staged build leaves out (linking it would leave their
// symbols unresolved), so this binding is ours: it checks the V3.2 case alone (576-wide Q, 512-wide V, 64 or 128
// heads, one KV head, no top-k lengths, sink or extra cache), and launches FlashMLA's three kernels as its own entry
// point does: the split scheduler (only when no schedule is passed in), the split decode, then the combine.
//
//   sparse_decode_fwd(q, kv, indices, sm_scale, schedule=None, num_splits=None) -> (out, lse, schedule, num_splits)
//     q (b, s_q, h, 576) bf16; kv (pages, page_size, 1, 656) float8_e4m3fn/uint8; indices (b, s_q, topk) int32,
//     topk a multiple of 64, entry = page * page_size + offset (-1: unused); out (b, s_q, h, 512) bf16; lse
//     (b, s_q, h) float32. A schedule depends on (b, s_q, h, topk) only: pass the returned one back to reuse it.
#include <algorithm>
#include <optional>
#include <tuple>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <pybind11/pybind11.h>
#include <torch/extension.h>

#include "params.h"
#include "sm90/decode/sparse_fp8/splitkv_mla.h"
#include "smxx/decode/combine/combine.h"
#include "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.h"

namespace {

constexpr int kQkWidth = 576;
constexpr int kVWidth = 512;
constexpr int kRowBytes = 656;        // 512 e4m3 + 4 float32 scales + 64 bf16 rope
constexpr int kTopkBlock = 64;        // the kernel's top-k tile: topk must be a multiple
constexpr int kHeadsPerPart = 64;     // FlashMLA's sm90 sizing: one SM part per 64 heads per query row
constexpr int kSchedOverheadBlocks = 5;
constexpr float kLog2E = 1.44269504f;

int as_int(int64_t value, const char* what) {
    TORCH_CHECK(value <= std::numeric_limits<int>::max(), what, " exceeds int32: ", value);
    return static_cast<int>(value);
}

template <typename T>
T* pointer(const at::Tensor& tensor) {
    return reinterpret_cast<T*>(tensor.data_ptr());
}

// How many SM parts the split scheduler spreads (b x s_q) rows over: FlashMLA's sm90 rule.
int sm_parts(int s_q, int heads) {
    int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    return std::max(sms / s_q / (heads / kHeadsPerPart), 1);
}

void check_inputs(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices) {
    auto* props = at::cuda::getCurrentDeviceProperties();
    TORCH_CHECK(props->major == 9 && props->minor == 0, "FlashMLA's sparse decode is built for sm_90a only");
    TORCH_CHECK(q.is_cuda() && kv.is_cuda() && indices.is_cuda(), "q, kv and indices must be CUDA tensors");
    TORCH_CHECK(q.device() == kv.device() && q.device() == indices.device(), "q, kv and indices: one device");
    TORCH_CHECK(q.dim() == 4 && q.scalar_type() == at::kBFloat16 && q.size(3) == kQkWidth,
                "q must be (b, s_q, h, 576) bf16");
    TORCH_CHECK(q.size(2) == 64 || q.size(2) == 128, "FlashMLA's sm90 sparse decode serves 64 or 128 heads");
    TORCH_CHECK(q.stride(3) == 1, "q's last dimension must be contiguous");
    TORCH_CHECK(kv.dim() == 4 && kv.size(2) == 1 && kv.size(3) == kRowBytes,
                "kv must be (pages, page_size, 1, 656): V3.2's fp8 rows");
    TORCH_CHECK(kv.scalar_type() == at::kFloat8_e4m3fn || kv.scalar_type() == at::kByte, "kv must be e4m3 or uint8");
    TORCH_CHECK(kv.stride(3) == 1 && kv.stride(1) == kRowBytes, "each page of kv must be contiguous");
    TORCH_CHECK(indices.dim() == 3 && indices.scalar_type() == at::kInt && indices.stride(2) == 1,
                "indices must be (b, s_q, topk) int32, last dimension contiguous");
    TORCH_CHECK(indices.size(0) == q.size(0) && indices.size(1) == q.size(1), "indices must match q's (b, s_q)");
    TORCH_CHECK(indices.size(2) > 0 && indices.size(2) % kTopkBlock == 0, "topk must be a positive multiple of 64");
}

// The split schedule of FlashMLA's scheduler kernel: (parts, sizeof(DecodingSchedMeta) / 4) int32 and (b + 1) int32.
std::tuple<at::Tensor, at::Tensor> make_schedule(int b, int s_q, int topk, int parts, const at::Tensor& q) {
    auto ints = q.options().dtype(at::kInt);
    at::Tensor schedule = torch::empty({parts, static_cast<int64_t>(sizeof(DecodingSchedMeta) / sizeof(int))}, ints);
    at::Tensor num_splits = torch::empty({b + 1}, ints);
    GetDecodeSchedMetaParams sched{};
    sched.b = b;
    sched.s_q = s_q;
    sched.block_size_n = kTopkBlock;
    sched.fixed_overhead_num_blocks = kSchedOverheadBlocks;
    sched.topk = topk;
    sched.extra_topk = 0;   // FlashMLA passes 0 when there is no extra cache
    sched.tile_scheduler_metadata_ptr = pointer<DecodingSchedMeta>(schedule);
    sched.num_splits_ptr = pointer<int>(num_splits);
    sched.num_sm_parts = parts;
    sched.stream = at::cuda::getCurrentCUDAStream().stream();
    smxx::decode::run_get_decoding_sched_meta_kernel(sched);
    return {schedule, num_splits};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sparse_decode_fwd(
        const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices, double sm_scale,
        std::optional<at::Tensor> schedule, std::optional<at::Tensor> num_splits) {
    check_inputs(q, kv, indices);
    const at::cuda::CUDAGuard guard(q.device());
    const int b = as_int(q.size(0), "batch"), s_q = as_int(q.size(1), "s_q"), heads = as_int(q.size(2), "heads");
    const int topk = as_int(indices.size(2), "topk");
    const int parts = sm_parts(s_q, heads);
    TORCH_CHECK(schedule.has_value() == num_splits.has_value(), "pass both schedule and num_splits, or neither");
    if (!schedule.has_value()) {
        std::tie(schedule, num_splits) = make_schedule(b, s_q, topk, parts, q);
    }
    TORCH_CHECK(schedule->is_contiguous() && schedule->size(0) == parts && num_splits->is_contiguous() &&
                num_splits->numel() == b + 1, "the schedule was made for another shape or device");

    auto options = q.options();
    at::Tensor out = torch::empty({b, s_q, heads, kVWidth}, options);
    at::Tensor lse = torch::empty({b, s_q, heads}, options.dtype(at::kFloat));
    // One partial per split: FlashMLA sizes them for b + parts splits, the most its scheduler makes.
    at::Tensor lse_accum = torch::empty({b + parts, s_q, heads}, options.dtype(at::kFloat));
    at::Tensor o_accum = torch::empty({b + parts, s_q, heads, kVWidth}, options.dtype(at::kFloat));
    cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();

    SparseAttnDecodeParams p{};
    p.b = b;
    p.s_q = s_q;
    p.h_q = heads;
    p.h_kv = 1;
    p.d_qk = kQkWidth;
    p.d_v = kVWidth;
    p.sm_scale = static_cast<float>(sm_scale);
    p.sm_scale_div_log2 = static_cast<float>(sm_scale) * kLog2E;
    p.num_blocks = as_int(kv.size(0), "pages");
    p.page_block_size = as_int(kv.size(1), "page_size");
    p.topk = topk;
    p.model_type = ModelType::V32;
    p.q = pointer<cutlass::bfloat16_t>(q);
    p.kv = pointer<cutlass::bfloat16_t>(kv);   // the kernel reads the bytes; the type is FlashMLA's field's
    p.indices = pointer<int>(indices);
    p.lse = pointer<float>(lse);
    p.out = pointer<cutlass::bfloat16_t>(out);
    p.stride_q_b = as_int(q.stride(0), "q stride");
    p.stride_q_s_q = as_int(q.stride(1), "q stride");
    p.stride_q_h_q = as_int(q.stride(2), "q stride");
    p.stride_kv_block = as_int(kv.stride(0), "kv stride");
    p.stride_kv_row = as_int(kv.stride(1), "kv stride");
    p.stride_indices_b = as_int(indices.stride(0), "indices stride");
    p.stride_indices_s_q = as_int(indices.stride(1), "indices stride");
    p.stride_lse_b = as_int(lse.stride(0), "lse stride");
    p.stride_lse_s_q = as_int(lse.stride(1), "lse stride");
    p.stride_o_b = as_int(out.stride(0), "out stride");
    p.stride_o_s_q = as_int(out.stride(1), "out stride");
    p.stride_o_h_q = as_int(out.stride(2), "out stride");
    p.stream = stream;
    p.lse_accum = pointer<float>(lse_accum);
    p.o_accum = pointer<float>(o_accum);
    p.stride_lse_accum_split = as_int(lse_accum.stride(0), "accum stride");
    p.stride_lse_accum_s_q = as_int(lse_accum.stride(1), "accum stride");
    p.stride_o_accum_split = as_int(o_accum.stride(0), "accum stride");
    p.stride_o_accum_s_q = as_int(o_accum.stride(1), "accum stride");
    p.stride_o_accum_h_q = as_int(o_accum.stride(2), "accum stride");
    p.tile_scheduler_metadata_ptr = pointer<DecodingSchedMeta>(*schedule);
    p.num_splits_ptr = pointer<int>(*num_splits);
    p.num_sm_parts = parts;
    if (heads == 64) {
        sm90::decode::sparse_fp8::run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32, 64>(p);
    } else {
        sm90::decode::sparse_fp8::run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32, 128>(p);
    }

    CombineParams c{};
    c.b = b;
    c.s_q = s_q;
    c.h_q = heads;
    c.d_v = kVWidth;
    c.lse = p.lse;
    c.out = p.out;
    c.stride_lse_b = p.stride_lse_b;
    c.stride_lse_s_q = p.stride_lse_s_q;
    c.stride_o_b = p.stride_o_b;
    c.stride_o_s_q = p.stride_o_s_q;
    c.stride_o_h_q = p.stride_o_h_q;
    c.lse_accum = p.lse_accum;
    c.o_accum = p.o_accum;
    c.stride_lse_accum_split = p.stride_lse_accum_split;
    c.stride_lse_accum_s_q = p.stride_lse_accum_s_q;
    c.stride_o_accum_split = p.stride_o_accum_split;
    c.stride_o_accum_s_q = p.stride_o_accum_s_q;
    c.stride_o_accum_h_q = p.stride_o_accum_h_q;
    c.tile_scheduler_metadata_ptr = p.tile_scheduler_metadata_ptr;
    c.num_splits_ptr = p.num_splits_ptr;
    c.num_sm_parts = parts;
    c.attn_sink = nullptr;
    c.stream = stream;
    smxx::decode::run_flash_mla_combine_kernel<cutlass::bfloat16_t>(c);
    return {out, lse, *schedule, *num_splits};
}

}  // namespace

PYBIND11_MODULE(cuda, module) {
    module.def("sparse_decode_fwd", &sparse_decode_fwd, pybind11::arg("q"), pybind11::arg("kv"),
               pybind11::arg("indices"), pybind11::arg("sm_scale"), pybind11::arg("schedule") = pybind11::none(),
               pybind11::arg("num_splits") = pybind11::none());
}
