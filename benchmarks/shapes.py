"""Decode shapes: the problem's 8 benchmark cases (read from benchmarks.txt, the case file eval.py runs) and the
sweep of the peers table.

A shape is `batch` segments of `q_len` queries with `num_heads` heads over `kv_len` cache rows each (uniform
lengths, as in every case of the problem).
"""
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHMARK_CASES = ROOT / "benchmarks.txt"
DEFAULT_HEADS = 16   # the problem's query heads

# The sweep: batch 1-512 by 8x, kv 512-32k by 4x. Points above 4M cache rows (4.8 GB of bf16 per input set) are
# left out: only (512, 32768) is, whose data alone would take longer to make than the rest of the sweep to time.
SWEEP_BATCHES = (1, 8, 64, 512)
SWEEP_KV_LENS = (512, 2048, 8192, 32768)
SWEEP_MAX_ROWS = 1 << 22


@dataclass(frozen=True)
class Shape:
    batch: int
    kv_len: int
    q_len: int = 1
    num_heads: int = DEFAULT_HEADS

    @property
    def label(self) -> str:
        return f"{self.batch}x{self.kv_len}"

    @property
    def cache_rows(self) -> int:
        return self.batch * self.kv_len

    def __str__(self):
        return f"{self.label} q{self.q_len} h{self.num_heads}"


def _benchmark_shapes() -> tuple:
    from eval import get_test_cases   # the harness's own parser of case files
    return tuple(Shape(case.args["batchsize"], case.args["kvseqlen"], case.args["qseqlen"])
                 for case in get_test_cases(str(BENCHMARK_CASES), None))


BENCHMARK_SHAPES = _benchmark_shapes()


def parse_shape(text: str, q_len: int = 1, num_heads: int = DEFAULT_HEADS) -> Shape:
    """'32x8192' -> Shape(32, 8192, q_len, num_heads); ValueError naming the shape when it is not one."""
    try:
        batch, kv_len = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"shape {text!r} is not BATCHxKV_LEN (e.g. 32x8192)") from None
    if batch < 1 or kv_len < q_len:
        raise ValueError(f"shape {text!r}: need batch >= 1 and kv_len >= q_len ({q_len})")
    return Shape(batch, kv_len, q_len, num_heads)


def parse_shapes(text: str) -> list:
    """'benchmark' (the 8 cases) or comma-separated shapes, e.g. '4x1024,32x8192'; '' for none."""
    if text == "benchmark":
        return list(BENCHMARK_SHAPES)
    return [parse_shape(item) for item in filter(None, text.split(","))]


def parse_ints(text: str) -> list:
    return [int(item) for item in filter(None, text.split(","))]


def sweep_shapes(batches, kv_lens, max_rows=SWEEP_MAX_ROWS):
    """(kept, left out): every batch x kv_len, those over max_rows cache rows left out."""
    every = [Shape(b, kv) for b in batches for kv in kv_lens]
    return [s for s in every if s.cache_rows <= max_rows], [s for s in every if s.cache_rows > max_rows]
