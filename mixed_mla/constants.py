"""Dimensions of DeepSeek-R1 MLA decode (absorbed form) and of its cache formats, named once."""
import math

KV_LORA_RANK = 512          # latent width: the V part of a KV row
QK_ROPE_HEAD_DIM = 64       # rotary part appended to the latent for Q.K
QK_HEAD_DIM = KV_LORA_RANK + QK_ROPE_HEAD_DIM   # 576
V_HEAD_DIM = KV_LORA_RANK   # 512
NUM_KV_HEADS = 1            # one latent row per token, shared by every query head (MQA)
DEFAULT_SM_SCALE = 1.0 / math.sqrt(QK_HEAD_DIM)  # 1/24
SUPPORTED_NUM_HEADS = (4, 8, 16, 32, 64, 128)  # 128 / TP: 4 and 8 are TP32 and TP16 of DeepSeek-R1
HEAD_GROUP = 16             # heads handled together by one kernel pass (one MMA M/N dimension)

KV_FORMATS = ("bf16", "fp8", "mxfp4")
# The format codes every kernel binding takes (sm90 config.h KvFormat; tests/test_kernel_constants.py parses it).
# gfx950's kernels read the first three; sm90's also fp8_ds_mla (DS_MLA_FORMAT below).
KV_FORMAT_CODES = {"bf16": 0, "fp8": 1, "mxfp4": 2, "fp8_ds_mla": 3}
MAX_SPLITS = 64             # KV splits per query row: the merge kernels' limit (config.h kMaxSplits)

FP8_E4M3_MAX = 448.0        # largest finite float8_e4m3fn

MXFP4_BLOCK = 32                                   # elements sharing one e8m0 scale
MXFP4_BLOCKS_PER_ROW = QK_HEAD_DIM // MXFP4_BLOCK  # 18
MXFP4_PACKED_ROW_BYTES = QK_HEAD_DIM // 2          # 288: two e2m1 codes per byte
MXFP4_SCALE_ROW_ALIGN = 256  # the scale tensor's rows are padded to a multiple of this
MXFP4_SCALE_COLS = 24        # 18 scales padded to a multiple of 8; columns 18..23 are garbage
E8M0_BIAS = 127

# DeepSeek-V3.2's fp8 cache (FlashMLA's V32_FP8Sparse, vLLM's "fp8_ds_mla"): 656 bytes per token, read by the dense
# paths and by decode_sparse (torch everywhere, cuda_sm90's kernels on sm90). Not one of the problem's formats
# (KV_FORMATS).
DS_MLA_FORMAT = "fp8_ds_mla"
SERVED_KV_FORMATS = KV_FORMATS + (DS_MLA_FORMAT,)   # every format the library reads
DS_MLA_TILE = 128                                  # latent values sharing one float32 scale
DS_MLA_TILES = KV_LORA_RANK // DS_MLA_TILE         # 4
DS_MLA_SCALES_OFFSET = KV_LORA_RANK                # bytes 0-511: 512 e4m3 latent values
DS_MLA_ROPE_OFFSET = DS_MLA_SCALES_OFFSET + 4 * DS_MLA_TILES   # bytes 512-527: 4 float32 scales
DS_MLA_ROW_BYTES = DS_MLA_ROPE_OFFSET + 2 * QK_ROPE_HEAD_DIM   # bytes 528-655: 64 bf16 rope values; 656 in all
