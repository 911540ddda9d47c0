"""Timing, each way implemented once.

Kernel level (`KernelTimer`): device events around one call, the L2 flushed and the GPU kept busy before each.
Before every timed call the GPU zeroes a buffer twice the L2's size (so no input survives in the cache) and then
spins long enough for the host to enqueue the call: the start event then fires right before the call's first
kernel, and the time is device work alone, not Python or launch overhead. The host time of each call is measured
too; a call whose host time exceeds the spin is reported as host-bound (its device time then includes launch
gaps). On a CPU device the time is the wall time of the call.

Whole call (`whole_call_us`): what eval.py's `timed_call` measures, host overhead included: sync, the harness's
cache flush (utils.clear_l2_cache_large: a write larger than the last-level cache), device events around the
call, sync. A different flush can be given (protocol_floor's read flush, which leaves no dirty lines).

Host time (`host_time_us`): perf_counter around each call while the GPU is kept busy, so no call ever waits for
the device.
"""
import statistics
import time
from dataclasses import dataclass

import torch

# Spin at least this long before a timed call; raised to twice a call's host time (~10 us for a bare kernel launch,
# ~100 us for heavily validated Python wrappers), but not past 1 ms: a call that syncs (the torch backend reads
# the indptr on the host) cannot be hidden by any spin and is reported host-bound instead.
_MIN_SPIN_US, _MAX_SPIN_US = 50.0, 1000.0
# The GPU is kept busy this long per call while host times are measured: longer than any non-syncing call.
HOST_PROBE_SPIN_US = 700.0
# Launches queued behind one spin stay far below the launch queue's depth.
CALLS_PER_SPIN = 50
_SPIN_CALIBRATION_CYCLES = 1_000_000
WHOLE_CALL_WARMUP = 3


@dataclass(frozen=True)
class Timing:
    median_us: float
    min_us: float
    reps: int
    host_us: float          # median host time of one call (the Python and launch cost)
    host_bound: bool        # host time exceeded the spin: device time includes launch gaps


class BusyGpu:
    """Keeps a CUDA device busy for a given time (torch.cuda._sleep, calibrated once against device events)."""

    def __init__(self, device):
        self.device = torch.device(device)
        torch.cuda._sleep(_SPIN_CALIBRATION_CYCLES)  # warm-up
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(_SPIN_CALIBRATION_CYCLES)
        stop.record()
        stop.synchronize()
        self.cycles_per_us = _SPIN_CALIBRATION_CYCLES / (start.elapsed_time(stop) * 1e3)

    def spin(self, us: float) -> None:
        torch.cuda._sleep(int(us * self.cycles_per_us))


def host_time_us(run, calls: int, busy: BusyGpu, spin_us_per_call: float = HOST_PROBE_SPIN_US) -> float:
    """Median host time of run(i) for i in range(calls), the GPU kept busy throughout."""
    times = []
    for first in range(0, calls, CALLS_PER_SPIN):
        batch = range(first, min(first + CALLS_PER_SPIN, calls))
        busy.spin(spin_us_per_call * len(batch))
        for index in batch:
            start = time.perf_counter()
            run(index)
            times.append((time.perf_counter() - start) * 1e6)
        torch.cuda.synchronize(busy.device)
    return statistics.median(times)


class KernelTimer:
    def __init__(self, device, budget_s: float = 0.3, min_reps: int = 5, max_reps: int = 50):
        self.device = torch.device(device)
        self.budget_s, self.min_reps, self.max_reps = budget_s, min_reps, max_reps
        self.on_gpu = self.device.type == "cuda"
        if self.on_gpu:
            l2_bytes = torch.cuda.get_device_properties(self.device).L2_cache_size
            self._flush = torch.empty(2 * l2_bytes, dtype=torch.uint8, device=self.device)
            self._busy = BusyGpu(self.device)

    def measure(self, run, num_sets: int = 1) -> Timing:
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
        host_us = host_time_us(lambda rep: run(rep % num_sets), 3, self._busy)
        spin_us = min(_MAX_SPIN_US, max(_MIN_SPIN_US, 2 * host_us))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        host_times = []
        for rep in range(reps):
            self._flush.zero_()
            self._busy.spin(spin_us)
            starts[rep].record()
            host_start = time.perf_counter()
            run(rep % num_sets)
            host_times.append((time.perf_counter() - host_start) * 1e6)
            stops[rep].record()
        self._sync()
        times = [start.elapsed_time(stop) * 1e3 for start, stop in zip(starts, stops)]
        host_median = statistics.median(host_times)
        return Timing(statistics.median(times), min(times), reps, host_median, host_median > spin_us)


def _harness_flush():
    from utils import clear_l2_cache_large   # the harness's flush, as eval.py's timed_call uses it
    clear_l2_cache_large()


def whole_call_us(call, repeats: int, device, flush=_harness_flush, warmup: int = WHOLE_CALL_WARMUP) -> float:
    """Median time in µs of call() timed as eval.py times a custom_kernel call, after `warmup` untimed calls."""
    device = torch.device(device)
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        if device.type != "cuda":
            flush()
            start = time.perf_counter()
            call()
            times.append((time.perf_counter() - start) * 1e6)
            continue
        torch.cuda.synchronize(device)
        flush()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        stop.record()
        torch.cuda.synchronize(device)
        times.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(times)
