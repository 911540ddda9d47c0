// The Python module `flash_mla.cuda` with FlashMLA's dense Hopper decode alone, for stage_flashmla.sh.
// FlashMLA's own binding (csrc/api/api.cpp) also binds its sparse and sm100 kernels, whose sources the staged build
// leaves out (they would triple the build time and the size); the dense entry point is FlashMLA's, unchanged, and
// flash_mla_interface.py calls it by the same name.
#include <pybind11/pybind11.h>

#include "api/dense_decode.h"

PYBIND11_MODULE(cuda, module) {
    module.def("dense_decode_fwd", &dense_attn_decode_interface);
}
