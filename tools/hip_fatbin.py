"""The device code object inside a HIP shared library (what hipcc, and so torch's load_inline on ROCm, links): the
library's offload bundle holds one code object per offload target; this finds the one for an architecture.

An uncompressed bundle (clang's __CLANG_OFFLOAD_BUNDLE__ format) is read here: the magic, a little-endian u64
entry count, then per entry u64 offset (from the bundle's start), u64 size, u64 triple length and the triple (e.g.
"hipv4-amdgcn-amd-amdhsa--gfx950", maybe with ":sramecc+:xnack-"). A compressed bundle ("CCOB", ROCm's
--offload-compress) is handed to ROCm's clang-offload-bundler, which reads both.

    python tools/hip_fatbin.py LIBRARY.so OUT.co [--arch gfx950]
"""
import argparse
import shutil
import struct
import subprocess
import sys
from pathlib import Path

MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_MAGIC = b"CCOB"
ROCM_BUNDLER = Path("/opt/rocm/llvm/bin/clang-offload-bundler")
ROCM_OBJCOPY = Path("/opt/rocm/llvm/bin/llvm-objcopy")
FATBIN_SECTION = ".hip_fatbin"


def bundle_entries(data: bytes, start: int) -> dict:
    """{triple: (offset in data, size)} of the uncompressed bundle at data[start:]."""
    (count,) = struct.unpack_from("<Q", data, start + len(MAGIC))
    at, entries = start + len(MAGIC) + 8, {}
    for _ in range(count):
        offset, size, triple_length = struct.unpack_from("<QQQ", data, at)
        at += 24
        triple = data[at:at + triple_length].decode()
        at += triple_length
        if start + offset + size > len(data):
            raise ValueError(f"bundle entry {triple} runs past the end of the file")
        entries[triple] = (start + offset, size)
    return entries


def targets_arch(triple: str, arch: str) -> bool:
    """Whether a bundle triple is a HIP code object for `arch` (any target features)."""
    return triple.startswith("hip") and triple.split("--", 1)[-1].split(":")[0] == arch


def code_object(library: Path, arch: str, out: Path) -> Path:
    """Writes the `arch` code object of `library` to `out`. Raises ValueError when there is none, or more than one
    that differ (the checks would not know which one the device loads)."""
    data = Path(library).read_bytes()
    found, at = [], data.find(MAGIC)
    while at >= 0:
        found += [data[o:o + n] for triple, (o, n) in bundle_entries(data, at).items() if targets_arch(triple, arch)]
        at = data.find(MAGIC, at + 1)
    if not found and COMPRESSED_MAGIC in data:
        found = [unbundled_by_rocm(Path(library), arch, out)]
    if not found:
        raise ValueError(f"{library}: no {arch} code object in its offload bundles")
    if len(set(found)) > 1:
        raise ValueError(f"{library}: {len(set(found))} different {arch} code objects")
    out.write_bytes(found[0])
    return out


def unbundled_by_rocm(library: Path, arch: str, out: Path) -> bytes:
    """A compressed bundle's `arch` code object, through ROCm's llvm-objcopy (the bundle section) and
    clang-offload-bundler."""
    bundler = shutil.which("clang-offload-bundler") or str(ROCM_BUNDLER)
    objcopy = shutil.which("llvm-objcopy") or str(ROCM_OBJCOPY)
    section = out.with_suffix(".fatbin")
    subprocess.run([objcopy, f"--dump-section={FATBIN_SECTION}={section}", str(library), str(out.with_suffix(".tmp"))],
                   check=True, capture_output=True)
    listed = subprocess.run([bundler, "--list", "--type=o", f"--input={section}"], check=True, capture_output=True,
                            text=True).stdout.split()
    triple = next((t for t in listed if targets_arch(t, arch)), None)
    if triple is None:
        raise ValueError(f"{library}: no {arch} code object among {listed}")
    subprocess.run([bundler, "--unbundle", "--type=o", f"--input={section}", f"--output={out}", f"--targets={triple}"],
                   check=True, capture_output=True)
    return out.read_bytes()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("library", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--arch", default="gfx950")
    args = parser.parse_args()
    print(code_object(args.library, args.arch, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
