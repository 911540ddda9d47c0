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
KV_FORMAT_CODES = {"bf16": 0, "fp8": 1, "mxfp4": 2}
MAX_SPLITS = 64             # KV splits per query row: the merge kernels' limit (config.h kMaxSplits)

FP8_E4M3_MAX = 448.0        # largest finite float8_e4m3fn

MXFP4_BLOCK = 32                                   # elements sharing one e8m0 scale
MXFP4_BLOCKS_PER_ROW = QK_HEAD_DIM // MXFP4_BLOCK  # 18
MXFP4_PACKED_ROW_BYTES = QK_HEAD_DIM // 2          # 288: two e2m1 codes per byte
MXFP4_SCALE_ROW_ALIGN = 256  # the scale tensor's rows are padded to a multiple of this
MXFP4_SCALE_COLS = 24        # 18 scales padded to a multiple of 8; columns 18..23 are garbage
E8M0_BIAS = 127
