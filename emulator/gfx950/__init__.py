"""gfx950 (MI355X) test equipment: the cited fact base (facts.py), the lane emulator built from it (emulation.h,
driver.cpp, lanes.py) and the numerics twin of the kernels' arithmetic (hip_twin.py). See docs/gfx950.md."""
