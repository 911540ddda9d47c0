// Host run of the MXFP4 byte-lookup expansion (kv_tiles.cuh Fp4Lookup, prmt's host twin in ptx.cuh): for every
// block exponent the lookup covers and a fixed set of packed words, one line "e word out0 out1 out2 out3" (hex bf16
// pairs). tests/test_sm90_static.py compares them with mixed_mla.formats' dequantisation, bit for bit.
#include <cstdio>

#include "kv_tiles.cuh"

int main() {
  uint32_t state = 12345u;
  for (uint32_t e = 0; e < 256; ++e) {
    if (!mla_sm90::Fp4Lookup::covers(e)) continue;
    const mla_sm90::Fp4Lookup lookup(e);
    for (int k = 0; k < 64; ++k) {
      // every code in every position first (all nibbles k), then pseudo-random words
      const uint32_t w = k < 16 ? k * 0x11111111u : (state = state * 1664525u + 1013904223u);
      uint32_t out[4];
      lookup.expand(w, out);
      printf("%u %08x %08x %08x %08x %08x\n", e, w, out[0], out[1], out[2], out[3]);
    }
  }
  return 0;
}
