// The emulator's stand-in for <hip/hip_runtime.h>: the kernels' prelude includes that header when it exists, and
// the emulator build (lanes.py) puts this folder first on the include path, so the unchanged kernel text gets the
// CPU lane emulation without knowing it is emulated.
#pragma once
#include "emulation.h"

// The kernels' resource attributes apply to GPU kernels only, which the host compiler refuses on plain functions:
// here they read as `unused`. Launch geometry is the emulator's own (runner.h), so nothing is lost.
#define amdgpu_flat_work_group_size(min_threads, max_threads) unused
#define amdgpu_waves_per_eu(waves) unused
