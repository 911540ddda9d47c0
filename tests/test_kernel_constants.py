"""The Python definitions of the kernel constants (constants.py, validate.py, the backends) are the ones the kernel
headers use: parsed from the headers here, so a change on one side alone fails."""
import re

import pytest

from mixed_mla import constants, kernels, validate
from mixed_mla.backends import cuda_sm90, hip_gfx950

_CONSTEXPR = re.compile(r"constexpr\s+(?:int|long long)\s+(\w+)\s*=\s*([\w\s()+*/-]+?)\s*;")
_ENUM = re.compile(r"enum\s+(\w+)\s*:\s*int\s*\{([^}]*)\}")


def header_constants(relpath: str) -> dict:
    """name -> value of every integer constexpr (literals and + - * / of earlier ones; / truncates, as in C++ for
    these non-negative values) and every `enum X : int` member of one header."""
    text = kernels.read(relpath)
    found = {}
    for name, expression in _CONSTEXPR.findall(text):
        try:
            found[name] = int(eval(expression.replace("/", "//"), {"__builtins__": {}}, dict(found)))
        except NameError:   # refers to something that is not an integer constexpr of this header
            pass
    for enum, members in _ENUM.findall(text):
        found[enum] = {name.strip(): int(value) for name, value in
                       (member.split("=") for member in members.split(",") if member.strip())}
    return found


def test_the_parser_reads_literals_and_enums_and_nothing_else():
    text = ("constexpr int kA = 3;  constexpr int kB = (kA * 2 + 1) / 2;\nconstexpr int kC = f(kA);\n"
            "enum E : int { kX = 0, kY = 4 };")
    original = kernels.read
    try:
        kernels.read = lambda relpath: text
        assert header_constants("any") == {"kA": 3, "kB": 3, "E": {"kX": 0, "kY": 4}}
    finally:
        kernels.read = original


# (Python value, its name in sm90/decode/config.h, its name in gfx950/decode/config.h)
SHARED_DIMENSIONS = [
    (constants.QK_HEAD_DIM, "kHeadDimQK", "QK_DIM"), (constants.V_HEAD_DIM, "kHeadDimV", "V_DIM"),
    (constants.HEAD_GROUP, "kHeadGroup", "HEAD_GROUP"),
    (constants.MXFP4_PACKED_ROW_BYTES, "kFp4RowBytes", "FP4_ROW_BYTES"),
    (constants.MXFP4_SCALE_COLS, "kFp4ScaleCols", "FP4_SCALE_ROW_BYTES"),
]


@pytest.mark.parametrize("value,sm90_name,gfx950_name", SHARED_DIMENSIONS, ids=[row[1] for row in SHARED_DIMENSIONS])
def test_both_archs_headers_hold_the_python_dimensions(value, sm90_name, gfx950_name):
    assert header_constants("sm90/decode/config.h")[sm90_name] == value
    assert header_constants("gfx950/decode/config.h")[gfx950_name] == value


def test_sm90_config_matches_the_python_definitions():
    config = header_constants("sm90/decode/config.h")
    assert config["kFp4Blocks"] == constants.MXFP4_BLOCKS_PER_ROW and config["kMaxSplits"] == constants.MAX_SPLITS
    assert config["KvFormat"] == {"kFormatBf16": constants.KV_FORMAT_CODES["bf16"],
                                  "kFormatFp8": constants.KV_FORMAT_CODES["fp8"],
                                  "kFormatMxfp4": constants.KV_FORMAT_CODES["mxfp4"],
                                  "kFormatDsMla": constants.KV_FORMAT_CODES[constants.DS_MLA_FORMAT]}
    assert config["Fp8Variant"] == {"kFp8Tile32": cuda_sm90.VARIANTS[""],
                                    "kFp8Tile64": cuda_sm90.VARIANTS["tile64"],
                                    "kFp8Gather": cuda_sm90.FP8_GATHER}
    assert config["Mxfp4Variant"] == {"kMxfp4Expand": cuda_sm90.VARIANTS[""],
                                      "kMxfp4Wgmma": cuda_sm90.VARIANTS["wgmma"]}
    assert config["IndptrViolation"] == {"kBadQoIndptr": validate.FLAG_BAD_QO_INDPTR,
                                         "kBadKvIndptr": validate.FLAG_BAD_KV_INDPTR}


def test_sm90_tile_sizes_are_the_ones_the_planner_rounds_splits_to():
    tiles = kernels.read("sm90/decode/kv_tiles.cuh")
    fp8 = re.search(r"KvTile<kFormatFp8, kVariant> : TileGeometry<kVariant == kFp8Tile64 \? (\d+) : (\d+)>", tiles)
    wgmma = re.search(r"constexpr int kTileTokens = (\d+);", kernels.read("sm90/decode/mxfp4_wgmma.cuh"))
    assert {"tile64": int(fp8.group(1)), "": int(fp8.group(2)), "wgmma": int(wgmma.group(1))} == cuda_sm90.TILE_TOKENS
    # the formats without variants (their tiles are CopiedBf16Tile's): the default variant's tile
    assert f"struct CopiedBf16Tile : TileGeometry<{cuda_sm90.TILE_TOKENS['']}>" in tiles
    for kv_format in ("Bf16", "Mxfp4"):
        assert f"struct KvTile<kFormat{kv_format}, kVariant> : CopiedBf16Tile<" in tiles


def test_gfx950_config_matches_the_python_definitions():
    config = header_constants("gfx950/decode/config.h")
    assert config["FP4_BLOCK"] == constants.MXFP4_BLOCK
    assert hip_gfx950.ROW_BYTES == {"fp8": config["FP8_ROW_BYTES"], "mxfp4": config["FP4_ROW_BYTES"]}


def test_gfx950_format_codes_are_the_python_ones():
    config = header_constants("gfx950/decode/config.h")
    assert config["KvFormat"] == {"kFormatBf16": 0, "kFormatFp8": 1, "kFormatMxfp4": 2}
    # gfx950 reads the problem's formats, under sm90's codes (which add fp8_ds_mla)
    sm90 = header_constants("sm90/decode/config.h")["KvFormat"]
    assert config["KvFormat"] == {name: code for name, code in sm90.items() if name != "kFormatDsMla"}
    assert {name: config["KvFormat"][f"kFormat{name.capitalize()}"] for name in constants.KV_FORMATS} == \
        {name: constants.KV_FORMAT_CODES[name] for name in constants.KV_FORMATS}
    assert config["IndptrViolation"] == {"kBadQoIndptr": validate.FLAG_BAD_QO_INDPTR,
                                         "kBadKvIndptr": validate.FLAG_BAD_KV_INDPTR}


def test_the_gfx950_selfcheck_layout_counts_in_the_kernels_tiles_and_buffers():
    """hip_gfx950.selfcheck_layout gives each workgroup as many tiles as the most tile buffers of any variant, so
    every prefetch wait runs in the check: its tile size and that count are config.h's."""
    config = kernels.read("gfx950/decode/config.h")
    assert header_constants("gfx950/decode/config.h")["TILE_TOKENS"] == hip_gfx950.TILE_TOKENS
    buffers = re.search(r"buffers_for_occupancy\(int occ\) \{ return occ == 4 \? (\d+) : occ == 3 \? (\d+) : (\d+); \}",
                        config)
    assert max(int(n) for n in buffers.groups()) == hip_gfx950.SELFCHECK_TILES_PER_WORKGROUP
