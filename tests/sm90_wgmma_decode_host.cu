// Host run of the MXFP4 wgmma kernel's K decode (mxfp4_wgmma.cuh TileTables + decode8, prmt's host twin in ptx.cuh):
// for tile tops and block exponents around them, and a fixed set of packed words, one line
// "top e word r0 r1" (hex e5m2 bytes). tests/test_sm90_static.py decodes the bytes and compares them with
// mixed_mla.formats' dequantisation times 2^-(top - 140), exactly where e >= top - 26.
#include <cstdio>

#include "mxfp4_wgmma.cuh"

int main() {
  uint32_t state = 12345u;
  const int tops[] = {27, 127, 140, 254};
  for (int top : tops) {
    const mla_sm90::wgmma_mxfp4::TileTables tables(top);
    for (int e = top - 30; e <= top; ++e) {
      if (e < 0) continue;
      uint32_t t0, t1;
      tables.of(e, t0, t1);
      for (int k = 0; k < 24; ++k) {
        // every code in every position first (all nibbles k), then pseudo-random words
        const uint32_t w = k < 16 ? k * 0x11111111u : (state = state * 1664525u + 1013904223u);
        uint32_t r0, r1;
        mla_sm90::wgmma_mxfp4::decode8(w, t0, t1, r0, r1);
        printf("%d %d %08x %08x %08x\n", top, e, w, r0, r1);
      }
    }
  }
  return 0;
}
