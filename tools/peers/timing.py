"""Kernel-level timing: device events around one call, the L2 flushed and the GPU kept busy before each.

Before every timed call the GPU zeroes a buffer twice the L2's size (so no input survives in the cache) and then
spins in `torch.cuda._sleep` long enough for the host to enqueue the call: the start event then fires right
before the call's first kernel, and the time is device work alone, not Python or launch overhead. The host time
of each call is measured too; a call whose host time exceeds the spin is reported as host-bound (its device time
then includes launch gaps). On a CPU device the time is the wall time of the call.
"""
import statistics
import time
from dataclasses import dataclass

import torch

# Spin at least this long before a timed call; raised to twice a call's host time (~10 us for a bare kernel launch,
# ~100 us for heavily validated Python wrappers), but not past 1 ms: a call that syncs (the torch backend reads
# the indptr on the host) cannot be hidden by any spin and is reported host-bound instead.
_MIN_SPIN_US, _MAX_SPIN_US = 50.0, 1000.0
# The GPU is kept busy this long while one call's host time is measured: longer than any non-syncing call.
_HOST_PROBE_SPIN_US = 2000.0
_SPIN_CALIBRATION_CYCLES = 1_000_000


@dataclass(frozen=True)
class Timing:
    median_us: float
    min_us: float
    reps: int
    host_us: float          # median host time of one call (the Python and launch cost)
    host_bound: bool        # host time exceeded the spin: device time includes launch gaps


class Timer:
    def __init__(self, device, budget_s: float = 0.3, min_reps: int = 5, max_reps: int = 50):
        self.device = torch.device(device)
        self.budget_s, self.min_reps, self.max_reps = budget_s, min_reps, max_reps
        self.on_gpu = self.device.type == "cuda"
        if self.on_gpu:
            l2_bytes = torch.cuda.get_device_properties(self.device).L2_cache_size
            self._flush = torch.empty(2 * l2_bytes, dtype=torch.uint8, device=self.device)
            self._cycles_per_us = self._calibrate_spin()

    def _calibrate_spin(self) -> float:
        torch.cuda._sleep(_SPIN_CALIBRATION_CYCLES)  # warm-up
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(_SPIN_CALIBRATION_CYCLES)
        stop.record()
        stop.synchronize()
        return _SPIN_CALIBRATION_CYCLES / (start.elapsed_time(stop) * 1e3)

    def measure(self, run, num_sets: int) -> Timing:
        """Median time of run(i), cycling i over the input sets; one untimed warm-up call per set first."""
        wall_start = time.perf_counter()
        for index in range(num_sets):
            run(index)
        self._sync()
        warm_up_s = (time.perf_counter() - wall_start) / num_sets
        reps = max(self.min_reps, min(self.max_reps, int(self.budget_s / max(warm_up_s, 1e-6))))
        if self.on_gpu:
            return self._measure_gpu(run, num_sets, reps)
        return self._measure_cpu(run, num_sets, reps)

    def _sync(self):
        if self.on_gpu:
            torch.cuda.synchronize(self.device)

    def _measure_cpu(self, run, num_sets, reps) -> Timing:
        times = []
        for rep in range(reps):
            start = time.perf_counter()
            run(rep % num_sets)
            times.append((time.perf_counter() - start) * 1e6)
        median = statistics.median(times)
        return Timing(median, min(times), reps, median, False)

    def _measure_gpu(self, run, num_sets, reps) -> Timing:
        host_us = self._host_time_us(run, num_sets)
        spin_cycles = int(min(_MAX_SPIN_US, max(_MIN_SPIN_US, 2 * host_us)) * self._cycles_per_us)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        host_times = []
        for rep in range(reps):
            self._flush.zero_()
            torch.cuda._sleep(spin_cycles)
            starts[rep].record()
            host_start = time.perf_counter()
            run(rep % num_sets)
            host_times.append((time.perf_counter() - host_start) * 1e6)
            stops[rep].record()
        self._sync()
        times = [start.elapsed_time(stop) * 1e3 for start, stop in zip(starts, stops)]
        host_median = statistics.median(host_times)
        spin_us = spin_cycles / self._cycles_per_us
        return Timing(statistics.median(times), min(times), reps, host_median, host_median > spin_us)

    def _host_time_us(self, run, num_sets) -> float:
        """Host time of one call while the GPU is busy (so the call never waits for it), median of 3."""
        times = []
        for rep in range(3):
            torch.cuda._sleep(int(_HOST_PROBE_SPIN_US * self._cycles_per_us))
            start = time.perf_counter()
            run(rep % num_sets)
            times.append((time.perf_counter() - start) * 1e6)
        self._sync()
        return statistics.median(times)
