"""The release check's one-line verdict (issue 38): eval.py's geometric mean against the fp8 bare read of the same run.

    python3 -m benchmarks.sm90.release_ratio RELEASE_DIR DEVICE COMMIT

Reads RELEASE_DIR/eval_benchmark.txt (eval.py's "geometric mean of means: X us") and RELEASE_DIR/protocol/probe.txt
(protocol_floor's "geomean: ... read dirty Y" line: the fastest plain read of the fp8 cache bytes, timed as eval.py
times a call), and writes RELEASE_DIR/ratio.txt:
    eval.py geomean X us / fp8 bare read geomean Y us (same run, DEVICE, COMMIT) = R
Both numbers must come from one device call: a bare read measured on another lease is not comparable.
"""
import re
import sys
from pathlib import Path

EVAL_GEOMEAN = re.compile(r"geometric mean of means: ([0-9.]+) us")
BARE_READ_GEOMEAN = re.compile(r"^geomean: ours dirty [0-9.]+, read dirty ([0-9.]+),", re.MULTILINE)


def number(pattern: re.Pattern, path: Path) -> float:
    found = pattern.search(path.read_text())
    if found is None:
        raise SystemExit(f"release_ratio: no '{pattern.pattern}' in {path}")
    return float(found.group(1))


def ratio_line(release_dir: Path, device: str, commit: str) -> str:
    ours = number(EVAL_GEOMEAN, release_dir / "eval_benchmark.txt")
    bare = number(BARE_READ_GEOMEAN, release_dir / "protocol" / "probe.txt")
    return (f"eval.py geomean {ours:.2f} us / fp8 bare read geomean {bare:.2f} us "
            f"(same run, {device}, {commit}) = {ours / bare:.3f}")


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    release_dir = Path(sys.argv[1])
    line = ratio_line(release_dir, sys.argv[2], sys.argv[3])
    (release_dir / "ratio.txt").write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
