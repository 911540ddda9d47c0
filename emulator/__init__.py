"""Test equipment that is not shipped: CPU emulators of the hardware the kernels target (gfx950/)."""
