"""The gfx950 (CDNA4, MI355X) hardware behaviours the decode kernels and their CPU emulation rely on, as data.

No AMD GPU is at hand, so each behaviour is taken from public primary sources and recorded here once, with its
citations, a confidence and any source that disagrees. The emulator (emulation.h) reads its lane maps, load
placement, counter encoding and number formats from the header `header()` writes from these records, never from
the kernel headers; `header(overrides)` writes a deliberately wrong variant for the mutation tests.

Confidence: "high" = two or more independent primary sources agree, or one normative source (the ISA guide) plus
working public code; "medium" = one source, or sources that are consistent but indirect. Where a fact is below
high and no kernel needs it, or the ISA leaves a result undefined, the emulator is hostile: it returns poison (NaN
patterns) so code that depends on the uncertain part fails instead of passing by luck. Where a design bets on a
fact (VARIANT_BETS: each hip_gfx950 variant names the facts it bets on), the hardware probes
(tools/gfx950_probes.py, an early step of the MI355X bring-up) settle it on the device before any decode runs, and a
fact that is contradicted, or that its probe could not settle, turns off exactly the variants that bet on it.
docs/gfx950.md states the same facts for a reader.
"""
from dataclasses import dataclass

ISA = "AMD Instinct CDNA4 ISA reference guide"
TRITON_AMD = "triton-lang/triton third_party/amd"
LLVM_AMDGPU = "llvm/llvm-project llvm/lib/Target/AMDGPU"
CVT_SCALEF32_TEST = "llvm/llvm-project llvm/test/CodeGen/AMDGPU/llvm.amdgcn.cvt.scalef32.pk.ll"


@dataclass(frozen=True)
class Fact:
    key: str
    statement: str
    value: object
    sources: tuple
    confidence: str              # "high" | "medium"
    disagree: tuple = ()
    bet_by: str = ""             # which kernel design depends on it ("" = none beyond the obvious); VARIANT_BETS
                                 # below is the same, per variant, as data


def scale_lane_table(per_block: int, per_row: int) -> tuple:
    """[K block][row] -> lane, for a lane map that happens to be affine (lane = per_block * kb + per_row * row)."""
    return tuple(tuple(per_block * kb + per_row * row for row in range(16)) for kb in range(4))


# A lane map is a tuple of runs (k_base, k_per_lane_group, length): a lane of group g = lane / 16 holds, element
# after element, K = k_base + k_per_lane_group * g + i for i < length, run after run.
FACTS = (
    Fact("wave_size", "A gfx950 wave has 64 lanes.", 64,
         (f"{ISA}, wavefront description (64 work-items)",
          f"{LLVM_AMDGPU}/AMDGPU.td (FeatureWavefrontSize64 for gfx9)"), "high"),
    Fact("lds_bytes_per_cu", "LDS is 160 KiB per CU, all of it addressable by one workgroup.", 160 * 1024,
         ("ROCm blog 'FP8 GEMM Optimization on AMD CDNA4 Architecture', table 1",
          f"{LLVM_AMDGPU}/AMDGPU.td (gfx950: FeatureAddressableLocalMemorySize163840)"), "high"),
    Fact("mfma_scale_16x16x128.ab_row",
         "v_mfma_scale_f32_16x16x128_f8f6f4: lane l holds row (A) / column (B) l % 16 of the operand.", 16,
         (f"{ISA}, section 7.1.5.1", f"{TRITON_AMD}: LinearLayoutConversions.cpp chooseScaledMfmaScaleLayout",
          "ROCm blog 'Matrix Core Programming on AMD CDNA3 and CDNA4 architecture'"), "high"),
    Fact("mfma_scale_16x16x128.fp8_k",
         "fp8 operand (format 0/1): a lane of group g holds K 16g..16g+15 in bytes 0-15 and K 64+16g..64+16g+15 in "
         "bytes 16-31 (two 16-value runs, not 32 contiguous values).",
         ((0, 16, 16), (64, 16, 16)),
         (f"{ISA}, section 7.1.5.1",
          f"{TRITON_AMD}: AccelerateAMDMatmul.cpp ScaledBlockedToScaledMFMAF8F6F4 (operand kWidth = kBase / 2 = 16 "
          "for every type)",
          "triton-lang/triton lib/Dialect/TritonGPU/IR/LinearLayoutConversions.cpp chooseScaledMfmaScaleLayout "
          "(comment: 'for mxfp6/mxfp8, there are 2 16-consecutive elements blocks')",
          "ROCm blog 'Matrix Core Programming on AMD CDNA3 and CDNA4 architecture' (fp8 example splits K at K/2)",
          "ROCm/aiter gfx950 a8w4 MoE kernels (+64-byte offset for the second run)"),
         "high", disagree=("iree-org/iree: models 32 contiguous values for every f8f6f4 type (only its fp4 path is "
                           "tested)",),
         bet_by="the mxfp4 variants: Q (fp8) is packed in this order against contiguous fp4 K; the fp8 variants "
                "put fp8 on both sides in the same order, so they are correct under either layout"),
    Fact("mfma_scale_16x16x128.fp4_k",
         "fp4 operand (format 4): a lane of group g holds K 32g..32g+31 contiguously in bytes 0-15 (bytes 16-31 "
         "unused), two values a byte (which nibble holds which: mfma_scale_16x16x128.fp4_nibble).",
         ((0, 32, 32),),
         (f"{ISA}, section 7.1.5.1", "triton-lang/triton LinearLayoutConversions.cpp chooseScaledMfmaScaleLayout "
          "(comment: 'with fp4 input, each lane takes 32 consecutive elements')",
          "Modular MAX docs: mxfp4_matmul_amd (16 contiguous bytes per lane, lane_chunk = lane / 16)"), "high",
         bet_by="the mxfp4 variants (the K side of Q.K)"),
    Fact("mfma_scale_16x16x128.fp4_nibble",
         "fp4 operand, also in a mixed fp8 x fp4 MFMA: element 2i of a lane is the low nibble of byte i, element "
         "2i + 1 the high nibble.", "low_even",
         ("OCP Microscaling Formats (MX) v1.0 specification (packed fp4: the first element in the low bits)",
          f"{TRITON_AMD}: the mxfp4 operands are packed low nibble first for the scaled MFMA"),
         "medium", bet_by="the mxfp4 variants: the cache's even values sit in the low nibbles and meet Q's even "
                          "fp8 slots; no source read here shows a mixed fp8 x fp4 MFMA with this order"),
    Fact("mfma_scale_16x16x128.scale_lane",
         "The e8m0 scale of row (A) / column (B) i and K block kb (32 values) of an fp4 operand is the byte picked "
         "by opsel from the scale register of lane 16 * kb + i: the lane that holds those 32 values.",
         scale_lane_table(16, 1),   # [K block][row] -> lane: a table, so any mapping can be stated and emulated
         ("triton-lang/triton LinearLayoutConversions.cpp chooseScaledMfmaScaleLayout (lane bases {0,1}..{0,8} "
          "on the row, {1,0},{2,0} on the K block, for 16x16)", f"{ISA}, section 7.1.5.1",
          "Modular MAX docs: mxfp4_matmul_amd ('the 64 scale values (16 rows x 4 K-groups) come from 64 lanes')"),
         "high", bet_by="the mxfp4 variants give the scale of (token n, K block g) to lane 16 g + n"),
    Fact("mfma_scale_16x16x128.opsel_0",
         "op_sel 0 of either scale operand (A's, B's) picks byte 0 of the lane's 32-bit scale register as its e8m0 "
         "scale.", 0,
         (f"{ISA}, section 7.2.1 (scale op_sel)",
          "llvm/llvm-project clang/include/clang/Basic/BuiltinsAMDGPU.def __builtin_amdgcn_mfma_scale_f32_16x16x128_"
          "f8f6f4 (op_sel as immediates)"), "medium",
         bet_by="every variant passes op_sel 0 on both operands with the scale in byte 0 (the other bytes zero): a "
                "different byte would scale every score by 2^-127"),
    Fact("mfma_scale_16x16x128.opsel",
         "op_sel n = 1, 2, 3 of either scale operand picks byte n of the lane's scale register.", (1, 2, 3),
         (f"{ISA}, section 7.2.1 (scale op_sel)",
          "llvm/llvm-project clang/include/clang/Basic/BuiltinsAMDGPU.def __builtin_amdgcn_mfma_scale_f32_16x16x128_"
          "f8f6f4 (op_sel as immediates)"), "medium",
         bet_by="none: no kernel passes an op_sel other than 0"),
    Fact("mfma_scale_16x16x128.fp8_scale_lane",
         "For an fp8 operand, whose lanes hold values of two K blocks each, Triton uses the same lane map, but no "
         "source read here exercises per-block fp8 scales.", scale_lane_table(16, 1),
         ("triton-lang/triton LinearLayoutConversions.cpp chooseScaledMfmaScaleLayout (one layout for every "
          "type; comment: 'for mxfp6/mxfp8 ... 2 scale elements are required')",), "medium",
         bet_by="none: the kernels give every fp8 operand the unit scale in every lane; the emulator returns NaN "
                "for an fp8 operand whose scale bytes differ between lanes"),
    Fact("mfma_16x16.d_layout",
         "16x16 MFMA result (f32x4): lane l register r holds row 4 * (l / 16) + r, column l % 16.", (4, 16),
         (f"{ISA}, section 7.1 (MFMA output layout)",
          "ROCm/amd_matrix_instruction_calculator (16x16 MFMA D layout)",
          "ROCm/composable_kernel include/ck/utility/xdlops_gemm.hpp (16x16 output layout)"), "high"),
    Fact("mfma_16x16x32_bf16.ab_k",
         "v_mfma_f32_16x16x32_bf16: lane l holds row/column l % 16 and K 8g..8g+7 (g = l / 16), element e at "
         "K 8g + e.", ((0, 8, 8),),
         ("ROCm blog 'Matrix Core Programming on AMD CDNA3 and CDNA4 architecture' (16x16x32 bf16 example)",
          "triton-lang/triton AccelerateAMDMatmul.cpp (kWidth 8 for the gfx950 16x16x32 bf16 MFMA)"), "high",
         bet_by="every variant on the row/column part; none on the K order: P and V use the same K order on both "
                "operands, so any K permutation cancels"),
    Fact("global_load_lds.placement",
         "Direct-to-LDS global loads: lane l's data lands at M0 base + offset + stride * l. 4-byte loads use a "
         "4-byte stride; 16-byte (dwordx4) loads a 16-byte stride; 12-byte (dwordx3) loads ALSO a 16-byte stride, "
         "writing bytes 0-11 of each slot and leaving the 4th dword unwritten.",
         {4: (4, 4), 12: (16, 12), 16: (16, 16)},
         (f"{ISA}, section 9.1.9", "triton-lang/triton third_party/amd/lib/TritonAMDGPUToLLVM/TargetInfo.cpp "
          "supportsDirectToLdsLoadBitWidth ('Disable 96 bits as it uses 128bit strides between threads')",
          "ROCm blog 'FP8 GEMM Optimization on AMD CDNA4 Architecture' (up to 128 bits per lane)"), "high",
         bet_by="every variant (16-byte tile loads); the mxfp4 variants' scale region too (one dwordx3 wave load "
                "of 32 x 24 bytes into 64 16-byte slots)"),
    Fact("global_load_lds.offset",
         "The direct-to-LDS load's immediate offset is added to both addresses: the lane's global address and the "
         "LDS destination (M0 base + offset + stride * lane).", {"global": True, "lds": True},
         ("llvm/llvm-project llvm/docs/AMDGPUDMAOperations (llvm.amdgcn.global.load.lds: 'offset applied to both "
          "global and LDS address')", f"{ISA}, section 9.1.9 (LDS_ADDR = M0 + inst_offset + TID * stride)"),
         "medium", bet_by="none: the kernels pass offset 0 and fold every offset into the pointers"),
    Fact("lds.uninitialised", "LDS contents at workgroup start are undefined.", "poison",
         (f"{ISA}, LDS chapter (contents are not initialised at dispatch)",), "high"),
    Fact("s_waitcnt.vmcnt_encoding",
         "gfx9 s_waitcnt: vmcnt is bits 3:0 (low) and 15:14 (high), expcnt 6:4, lgkmcnt 11:8.",
         {"lo": (0, 4), "hi": (14, 2)},
         ("llvm/llvm-project llvm/lib/Target/AMDGPU/Utils/AMDGPUBaseInfo.cpp encodeVmcnt/getVmcntBitShiftHi",
          f"{ISA}, S_WAITCNT"), "high", bet_by="the tile pipeline's waits"),
    Fact("s_waitcnt.lds_dma",
         "Direct-to-LDS loads count in vmcnt and retire in issue order; their LDS bytes are valid only after an "
         "s_waitcnt vmcnt that covers them. Until then the destination is undefined.",
         # late_loads: the loads a wait for vmcnt(n), n > 0, leaves in flight beyond n. 0 on the hardware the
         # sources describe; a wrong-timing hardware (the mutation tests) completes that many loads later than the
         # count implies, which only a workgroup with a tile in flight past its wait (a prefetch wait) can meet.
         {"order": "in_order", "late_loads": 0},
         (f"{ISA}, section 9.1.9", "llvm/llvm-project SIInsertWaitcnts.cpp (LDS DMA tracked as a VMEM access)"),
         "high", bet_by="the tile pipeline's waits"),
    Fact("e4m3fn", "OCP e4m3fn: bias 7, no infinities, NaN = S.1111.111 (0x7F/0xFF), max 448, min subnormal 2^-9.",
         {"bias": 7, "max": 448.0, "nan": (0x7F, 0xFF)},
         ("OCP 8-bit Floating Point Specification (OFP8) rev 1.0", f"{ISA}, section 7.1 (FP8 formats: OCP on CDNA4)",
          "ROCm blog 'Matrix Core Programming on AMD CDNA3 and CDNA4 architecture' (E4M3FN on CDNA4, FNUZ on "
          "CDNA3)"), "high"),
    Fact("e2m1", "OCP e2m1 (fp4): values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; no NaN or infinity.",
         (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0),
         ("OCP Microscaling Formats (MX) v1.0 specification", f"{ISA}, section 7.1 (FP4 format)"), "high"),
    Fact("e8m0", "OCP e8m0 scale: 2^(e - 127), 0xFF = NaN, no sign and no zero.", {"bias": 127, "nan": 0xFF},
         ("OCP Microscaling Formats (MX) v1.0 specification", f"{ISA}, section 7.1.5.1"), "high"),
    Fact("cvt_pk_fp8_f32",
         "v_cvt_pk_fp8_f32: two f32 -> two e4m3fn, round to nearest even; word_sel 0 writes bytes 0-1, 1 writes "
         "bytes 2-3 and keeps the others. Out of range (|x| > 448) without clamp: not pinned down by the sources.",
         {"rounding": "nearest_even", "out_of_range": "poison", "select": "word"},
         ("llvm/llvm-project llvm/lib/Target/AMDGPU/VOP3Instructions.td V_CVT_PK_FP8_F32 (vdst_in tied, "
          "op_sel[3] word select)", f"{ISA}, V_CVT_PK_FP8_F32"), "high",
         bet_by="every variant packs Q with it (in range: Q is scaled into [128, 256) first)"),
    Fact("cvt_scalef32_pk_bf16_fp8",
         "v_cvt_scalef32_pk_bf16_fp8: bytes 2w, 2w+1 (w = word_sel) -> two bf16 (the lower byte first), each "
         "times the f32 scale.", {"select": "word", "first": "low"},
         ("llvm/llvm-project clang/include/clang/Basic/BuiltinsAMDGPU.def __builtin_amdgcn_cvt_scalef32_pk_bf16_fp8",
          CVT_SCALEF32_TEST, f"{ISA}, VOP3 conversion instructions"),
         "high", bet_by="the fp8 variants' V conversion"),
    Fact("cvt_scalef32_pk_bf16_fp4",
         "v_cvt_scalef32_pk_bf16_fp4: byte b (b = byte_sel) -> two bf16, the low nibble first, each times the f32 "
         "scale. A scale whose exponent field is 0 (zero or subnormal, e.g. e8m0 byte 0 = 2^-127) is not pinned "
         "down by the sources.", {"select": "byte", "first": "low", "subnormal_scale": "poison"},
         ("llvm/llvm-project clang/include/clang/Basic/BuiltinsAMDGPU.def __builtin_amdgcn_cvt_scalef32_pk_bf16_fp4",
          CVT_SCALEF32_TEST, f"{ISA}, VOP3 conversion instructions"),
         "high", bet_by="the mxfp4 variants' V conversion (the subnormal scale: none, the self-check's and the "
                       "problem's scales are normal)"),
    Fact("cvt_pk_bf16_f32", "gfx950 converts f32 -> bf16 in hardware (v_cvt_pk_bf16_f32), round to nearest even.",
         "nearest_even",
         ("llvm/llvm-project llvm/lib/Target/AMDGPU/AMDGPU.td (gfx950: FeatureBF16ConversionInsts, V_CVT_PK_BF16_F32)",
          f"{ISA}, VOP3 conversion instructions"), "high", bet_by="P and the outputs"),
    Fact("v_exp_f32", "v_exp_f32 is 2^x to about 1 ulp; 2^-inf = 0.", {"ulp": 1},
         (f"{ISA}, V_EXP_F32", "llvm/llvm-project AMDGPU: __builtin_amdgcn_exp2f lowers to v_exp_f32"),
         "high", bet_by="the softmax"),
    Fact("v_log_f32", "v_log_f32 is log2(x) to about 1 ulp; log2(0) = -inf.", {"ulp": 1},
         (f"{ISA}, V_LOG_F32", "llvm/llvm-project AMDGPU: __builtin_amdgcn_logf lowers to v_log_f32"),
         "high", bet_by="the split LSE"),
    Fact("v_frexp_exp_i32_f32", "v_frexp_exp_i32_f32: e with x = m * 2^e, |m| in [0.5, 1); 0 for 0, inf, NaN.",
         "frexp", (f"{ISA}, V_FREXP_EXP_I32_F32",), "high", bet_by="the Q scaling"),
    Fact("v_ldexp_f32", "v_ldexp_f32: x * 2^e with IEEE overflow to infinity (so 2^128 is inf).", "ieee",
         (f"{ISA}, V_LDEXP_F32",), "high",
         bet_by="the Q scaling caps its exponent so 2^s and 2^-s stay finite and normal"),
    Fact("ds_bpermute_b32", "ds_bpermute_b32: lane l reads the value of lane (address / 4) % 64.", 4,
         (f"{ISA}, DS_BPERMUTE_B32", "ROCm/composable_kernel warp shuffle helpers"), "high",
         bet_by="the cross-lane max and sum"),
    Fact("global_atomic.rmw",
         "global_atomic_or_b32 / global_atomic_smin_i32 (what HIP's atomicOr / atomicMin on an int lower to: "
         "__hip_atomic_fetch_or / _min, relaxed, agent scope) are indivisible read-modify-writes of a naturally "
         "aligned dword in global memory; smin compares as signed 32-bit. At agent scope the result is seen by every "
         "workgroup of the device and by the host once the kernel has completed (system scope too); a narrower "
         "scope (wavefront, workgroup, cluster) does not promise that, and a misaligned address is not a supported atomic.",
         {"ops": ("or", "smin"), "visible_scopes": ("agent", "system"), "align": 4},
         (f"{ISA}, FLAT/GLOBAL atomic instructions (GLOBAL_ATOMIC_OR, GLOBAL_ATOMIC_SMIN)",
          "llvm/llvm-project llvm/docs/AMDGPUUsage.rst, memory model (atomicrmw at agent scope on global memory)",
          "ROCm/clr hipamd/include/hip/amd_detail/amd_hip_atomic.h atomicOr / atomicMin (int): "
          "__hip_atomic_fetch_or / __hip_atomic_fetch_min, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT"), "high",
         bet_by="the indptr error flag: thread 0 of one workgroup per segment ORs the violation bits into flag[0] "
                "and takes the min of the segment into flag[1]"),
    Fact("global_atomic.counter",
         "__hip_atomic_fetch_add (relaxed, agent scope) on a naturally aligned global dword is global_atomic_add "
         "with return: an indivisible read-modify-write that returns the old value; __hip_atomic_store (relaxed, "
         "agent scope) is a global store every workgroup's later agent-scope RMW reads after. Relaxed atomics order "
         "no other memory access: a plain store before one may become visible after it, a load after one may read "
         "a value older than it.",
         {"ops": ("add", "store"), "returns": "old", "order": "relaxed", "visible_scopes": ("agent", "system"),
          "align": 4},
         (f"{ISA}, FLAT/GLOBAL atomic instructions (GLOBAL_ATOMIC_ADD with GLC/SC0: return the pre-op value)",
          "llvm/llvm-project llvm/docs/AMDGPUUsage.rst, 'Memory Model GFX942' (gfx940-gfx950): monotonic atomicrmw "
          "at agent scope is a bare global_atomic; only acquire/release add cache maintenance and waits",
          "ROCm/clr hipamd/include/hip/amd_detail/amd_hip_atomic.h atomicAdd: __hip_atomic_fetch_add, "
          "__ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT"), "high",
         bet_by="the fused kernels' split counters (fused_merge.h): thread 0 adds 1 per finished split; the one "
                "that reads num_splits - 1 merges and stores 0"),
    Fact("fence.agent",
         "__builtin_amdgcn_fence(release, \"agent\") on gfx950 is buffer_wbl2 sc1 then s_waitcnt vmcnt(0): it "
         "writes back the L2 (one per XCD, not coherent with the others) and waits for the running wave's own "
         "earlier stores, so they are visible at agent scope before its later stores and atomics. It cannot wait "
         "for other waves' stores: each wave that stored must fence. The acquire fence is buffer_inv sc1: later "
         "loads miss the stale L1/L2 lines and see what was released before the atomic the wave read. Fences at "
         "workgroup scope order nothing between workgroups.",
         {"release": "buffer_wbl2 sc1; s_waitcnt vmcnt(0)", "acquire": "buffer_inv sc1",
          "visible_scopes": ("agent", "system"), "own_wave_only": True},
         ("llvm/llvm-project llvm/docs/AMDGPUUsage.rst, 'Memory Model GFX942' code sequences (fence release / "
          "acquire, agent scope)",
          "llvm/llvm-project pull 161638 ('Our release fences aren't strong enough to wait on stores from other "
          "waves')",
          "this repository: clang 22 compiles the fused kernels' fences to exactly these sequences for gfx950 "
          "(tests/test_gfx950_static.py)"), "high",
         bet_by="the fused kernels: every lane fences (release, agent) after its partial stores, before the "
                "barrier and thread 0's arrival; every lane of the last arriver fences (acquire, agent) before "
                "reading the partials"),
    Fact("mfma.accumulation",
         "MFMA products of fp8/fp4/bf16 inputs are exact in f32, and a sum whose every partial sum is exact in f32 "
         "comes out exact; the order of the internal sums is not specified.",
         "unordered",
         (f"{ISA}, section 7.1", "ROCm blog 'Matrix Core Programming on AMD CDNA3 and CDNA4 architecture'"),
         "medium", bet_by="none: the strict bound leaves room for any summation order"),
    Fact("lds.barrier_visibility",
         "s_barrier synchronises execution only: it does not wait for the wave's outstanding LDS operations, which "
         "lgkmcnt counts (bits 11:8 of s_waitcnt) and which complete in issue order. A wave's ds_write reaches the "
         "other waves after a barrier only if the wave ran s_waitcnt lgkmcnt(0) before it; LLVM's workgroup-scope "
         "release fence is that wait (plus vmcnt(0) while direct-to-LDS loads are in flight), and on gfx950 LLVM "
         "adds no wait before s_barrier of its own.",
         {"lgkmcnt": (8, 4), "barrier_waits_for_lds": False},
         (f"{ISA}, S_BARRIER (waits for the workgroup's waves, not for memory counters) and S_WAITCNT (LGKM_CNT: "
          "LDS, GDS, constant and message operations)",
          "llvm/llvm-project llvm/docs/AMDGPUUsage.rst, 'Memory Model GFX942' (LDS operations complete in "
          "execution order per wave; fence release at workgroup scope is s_waitcnt lgkmcnt(0))",
          "llvm/llvm-project SIInsertWaitcnts.cpp (no implicit wait before S_BARRIER on targets with "
          "FeatureBackOffBarrier, which gfx950 has; pull 154970)",
          "this repository: clang 22's gfx950 code for the bare s_barrier after a ds_write (occ4's Q, the indptr "
          "guard's scan, before workgroup_sync) had no lgkmcnt wait between them (tools/gfx950_code_object.py)"),
         "high", bet_by="every plain LDS hand-off (prelude.h workgroup_sync: occ4's Q, the fused verdict, the indptr "
                        "guard's scan)"),
)

BY_KEY = {f.key: f for f in FACTS}

# The facts each hip_gfx950 variant ("format:variant", MLA_GFX950_DISABLE's spelling) bets on: a fact that is
# contradicted, or that no probe could settle, turns off exactly the variants that name it. Facts no variant names
# (the op_sel bytes 1-3, fp8 per-block scale lanes, the direct-to-LDS immediate offset, the accumulation order) are
# still probed and reported. The K order of the bf16 MFMA is in every list for its row part and for A and B sharing
# one K order; any common K order would cancel in P.V.
_EVERY_STAGE1 = ("wave_size", "lds_bytes_per_cu", "mfma_scale_16x16x128.ab_row", "mfma_scale_16x16x128.opsel_0",
                 "mfma_16x16.d_layout", "mfma_16x16x32_bf16.ab_k", "global_load_lds.placement",
                 "s_waitcnt.vmcnt_encoding", "s_waitcnt.lds_dma", "e4m3fn", "e8m0", "cvt_pk_fp8_f32",
                 "cvt_pk_bf16_f32", "v_exp_f32", "v_log_f32", "v_frexp_exp_i32_f32", "v_ldexp_f32", "ds_bpermute_b32",
                 "global_atomic.rmw")
_FP8 = _EVERY_STAGE1 + ("cvt_scalef32_pk_bf16_fp8",)      # fp8 on both sides of Q.K: any common fp8 K order serves
_MXFP4 = _EVERY_STAGE1 + ("mfma_scale_16x16x128.fp8_k", "mfma_scale_16x16x128.fp4_k",
                          "mfma_scale_16x16x128.fp4_nibble", "mfma_scale_16x16x128.scale_lane", "e2m1",
                          "cvt_scalef32_pk_bf16_fp4")
_FUSED = _FP8 + ("global_atomic.counter", "fence.agent")  # the last arriver merges (fused_merge.h)
VARIANT_BETS = {**{f"fp8:occ{n}": _FP8 for n in (2, 3, 4)}, **{f"mxfp4:occ{n}": _MXFP4 for n in (2, 3, 4)},
                **{f"fp8:fused_occ{n}": _FUSED for n in (2, 3, 4)}}


def variants_betting_on(keys) -> list:
    """The variants (VARIANT_BETS' keys) that bet on any of these facts, as MLA_GFX950_DISABLE patterns."""
    keys = set(keys)
    return disable_patterns(v for v, bets in VARIANT_BETS.items() if keys & set(bets))


def disable_patterns(variants) -> list:
    """VARIANT_BETS' variants as MLA_GFX950_DISABLE patterns: a format all of whose variants are named becomes
    "format:*" (so the backend stops serving it), the rest stay by name."""
    named = set(variants)
    patterns = []
    for kv_format in dict.fromkeys(v.split(":")[0] for v in VARIANT_BETS):
        own = [v for v in VARIANT_BETS if v.startswith(kv_format + ":")]
        patterns += [f"{kv_format}:*"] if all(v in named for v in own) else [v for v in own if v in named]
    return patterns
# clang's HIP memory scopes (the __HIP_MEMORY_SCOPE_* macros clang predefines in HIP mode; the emulator defines the
# same numbers): clang/lib/Frontend/InitPreprocessor.cpp.
HIP_MEMORY_SCOPES = {"singlethread": 1, "wavefront": 2, "workgroup": 3, "agent": 4, "system": 5, "cluster": 6}
CONFIDENCE = ("high", "medium")
SELECT_BYTES = {"byte": 1, "word": 2}   # bytes a conversion's select operand steps by (the cvt facts' "select")


def value(key: str, overrides=None):
    """The value of a fact, or its override (the mutation tests' wrong hardware)."""
    overrides = overrides or {}
    return overrides[key] if key in overrides else BY_KEY[key].value


def uncertain(key: str) -> bool:
    """Whether the emulator must be hostile where this fact applies: it is below high confidence."""
    return BY_KEY[key].confidence != "high"


def lane_k_map(runs) -> list:
    """[lane group][element] -> K, from a fact's runs (k_base, k_per_lane_group, length)."""
    return [[base + per_group * g + i for base, per_group, length in runs for i in range(length)] for g in range(4)]


def _table(name: str, rows) -> str:
    body = ", ".join("{" + ", ".join(str(x) for x in row) + "}" for row in rows)
    return f"constexpr int {name}[{len(rows)}][{len(rows[0])}] = {{{body}}};"


def header(overrides=None) -> str:
    """The C++ header the emulator is built with: the facts' data as constants (overrides replace values)."""
    fp8, fp4 = (lane_k_map(value(k, overrides)) for k in ("mfma_scale_16x16x128.fp8_k",
                                                          "mfma_scale_16x16x128.fp4_k"))
    bf16 = lane_k_map(value("mfma_16x16x32_bf16.ab_k", overrides))
    placement = value("global_load_lds.placement", overrides)
    vm = value("s_waitcnt.vmcnt_encoding", overrides)
    e4m3, e8m0 = value("e4m3fn", overrides), value("e8m0", overrides)
    atomic = value("global_atomic.rmw", overrides)
    scale_rows = value("mfma_scale_16x16x128.scale_lane", overrides)
    opsel_bytes = (value("mfma_scale_16x16x128.opsel_0", overrides),) + tuple(value("mfma_scale_16x16x128.opsel",
                                                                                     overrides))
    offset = value("global_load_lds.offset", overrides)
    cvt_fp8, cvt_bf16_fp8, cvt_bf16_fp4 = (value(k, overrides) for k in ("cvt_pk_fp8_f32", "cvt_scalef32_pk_bf16_fp8",
                                                                         "cvt_scalef32_pk_bf16_fp4"))
    lds_rows = [[size, stride, written] for size, (stride, written) in sorted(placement.items())]
    lines = [
        "// Generated by emulator/gfx950/facts.py from the cited fact base; do not edit.",
        "#pragma once",
        "namespace mla_facts {",
        f"constexpr int WAVE = {value('wave_size', overrides)};",
        "// what the emulated occupancy query (the probes' lds_occupancy) divides by",
        f"constexpr int LDS_BYTES_PER_CU = {value('lds_bytes_per_cu', overrides)};",
        f"constexpr int AB_ROWS = {value('mfma_scale_16x16x128.ab_row', overrides)};",
        "// [lane group][element] -> K of the scaled 16x16x128 MFMA, per operand format",
        _table("F8_K", fp8), _table("F4_K", fp4),
        "// [K block][row] -> lane holding that block's e8m0 scale",
        _table("SCALE_LANE", scale_rows),
        "// the byte of the scale register each op_sel picks; fp4 element 2i in the low (true) or high nibble",
        "constexpr int OPSEL_BYTE[4] = {" + ", ".join(str(b) for b in opsel_bytes) + "};",
        "constexpr bool F4_LOW_NIBBLE_EVEN = "
        f"{str(value('mfma_scale_16x16x128.fp4_nibble', overrides) == 'low_even').lower()};",
        "// [lane group][element] -> K of the 16x16x32 bf16 MFMA",
        _table("BF16_K", bf16),
        f"constexpr int D_ROWS_PER_GROUP = {value('mfma_16x16.d_layout', overrides)[0]};",
        "// direct-to-LDS loads: {bytes per lane, LDS stride between lanes, bytes written per lane}",
        _table("LDS_DMA", lds_rows),
        "// where a direct-to-LDS load's immediate offset applies",
        f"constexpr bool LDS_DMA_OFFSET_GLOBAL = {str(offset['global']).lower()}, "
        f"LDS_DMA_OFFSET_LDS = {str(offset['lds']).lower()};",
        "// conversions: bytes selected per unit of the select operand; which half comes first",
        f"constexpr int CVT_PK_FP8_SELECT_BYTES = {SELECT_BYTES[cvt_fp8['select']]};",
        f"constexpr int CVT_BF16_FP8_SELECT_BYTES = {SELECT_BYTES[cvt_bf16_fp8['select']]};",
        f"constexpr bool CVT_BF16_FP8_LOW_FIRST = {str(cvt_bf16_fp8['first'] == 'low').lower()};",
        f"constexpr int CVT_BF16_FP4_SELECT_BYTES = {SELECT_BYTES[cvt_bf16_fp4['select']]};",
        f"constexpr bool CVT_BF16_FP4_LOW_FIRST = {str(cvt_bf16_fp4['first'] == 'low').lower()};",
        f"constexpr int VMCNT_LO_SHIFT = {vm['lo'][0]}, VMCNT_LO_BITS = {vm['lo'][1]};",
        f"constexpr int VMCNT_HI_SHIFT = {vm['hi'][0]}, VMCNT_HI_BITS = {vm['hi'][1]};",
        "// loads a wait for vmcnt(n), n > 0, leaves in flight beyond n (0: exactly n)",
        f"constexpr int VMCNT_LATE_LOADS = {value('s_waitcnt.lds_dma', overrides)['late_loads']};",
        f"constexpr int E4M3_BIAS = {e4m3['bias']};",
        f"constexpr float E4M3_MAX = {e4m3['max']}f;",
        f"constexpr int E8M0_BIAS = {e8m0['bias']}, E8M0_NAN = {e8m0['nan']};",
        "constexpr float E2M1[8] = {" + ", ".join(f"{v}f" for v in value("e2m1", overrides)) + "};",
        "// below high confidence: an fp8 operand's scales must be the same in every lane, else the result is NaN",
        f"constexpr bool FP8_SCALES_UNIFORM_ONLY = {str(uncertain('mfma_scale_16x16x128.fp8_scale_lane')).lower()};",
        f"constexpr int BPERMUTE_BYTES_PER_LANE = {value('ds_bpermute_b32', overrides)};",
        f"constexpr int TRANSCENDENTAL_ULP = {value('v_exp_f32', overrides)['ulp']};",
        "// global atomics: alignment, and the scopes (clang's __HIP_MEMORY_SCOPE_* numbers) whose result the host",
        "// and every workgroup see; 'smin' signed",
        f"constexpr int ATOMIC_ALIGN = {atomic['align']};",
        "constexpr int ATOMIC_VISIBLE_SCOPES[] = {" + ", ".join(str(HIP_MEMORY_SCOPES[x]) for x in
                                                            atomic["visible_scopes"]) + "};",
        f"constexpr bool ATOMIC_MIN_SIGNED = {str('smin' in atomic['ops']).lower()};",
        "// the split counters' fetch_add returns the value before (true) or after its add",
        "constexpr bool COUNTER_RETURNS_OLD = "
        f"{str(value('global_atomic.counter', overrides)['returns'] == 'old').lower()};",
        "// fences: the scopes that order memory between workgroups; whether a release waits only for its own wave",
        "constexpr int FENCE_VISIBLE_SCOPES[] = {" + ", ".join(str(HIP_MEMORY_SCOPES[x]) for x in
                                                           value("fence.agent", overrides)["visible_scopes"]) + "};",
        f"constexpr bool FENCE_RELEASES_OWN_WAVE_ONLY = "
        f"{str(value('fence.agent', overrides)['own_wave_only']).lower()};",
        "// s_waitcnt's lgkmcnt field; whether s_barrier waits for LDS stores (else an unreleased one is poison)",
        f"constexpr int LGKMCNT_SHIFT = {value('lds.barrier_visibility', overrides)['lgkmcnt'][0]}, "
        f"LGKMCNT_BITS = {value('lds.barrier_visibility', overrides)['lgkmcnt'][1]};",
        "constexpr bool BARRIER_WAITS_FOR_LDS = "
        f"{str(value('lds.barrier_visibility', overrides)['barrier_waits_for_lds']).lower()};",
        "}  // namespace mla_facts",
    ]
    return "\n".join(lines) + "\n"
