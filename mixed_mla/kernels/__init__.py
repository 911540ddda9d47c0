"""Kernel sources: read from the package directory, or from the table a bundled submission.py embeds.

Device code lives in real .cu/.hip files so compilers can check them standalone; the backends get the text
through `read` (one file) or `materialize` (a directory on disk for #include), which work the same whether the
package was imported from the repository or from the single-file submission, and build it with `jit_build`.
"""
import hashlib
import os
import tempfile
from pathlib import Path

# Filled by tools/bundle.py in submission.py: relative path -> file text. Empty in the repository.
_EMBEDDED: dict = {}

_HERE = Path(__file__).resolve().parent
SOURCE_SUFFIXES = (".cu", ".cuh", ".h", ".hip", ".cpp")
# Host code every arch's binding shares (decode_binding.h): on every build's include path, in every bundle.
COMMON_DIR = "common"


def _all_sources() -> dict:
    if _EMBEDDED:
        return dict(_EMBEDDED)
    return {p.relative_to(_HERE).as_posix(): p.read_text()
            for p in sorted(_HERE.rglob("*")) if p.suffix in SOURCE_SUFFIXES}


def read(relpath: str) -> str:
    """Text of one kernel source, e.g. read("sm90/decode/decode.cu")."""
    sources = _all_sources()
    if relpath not in sources:
        raise FileNotFoundError(f"no kernel source {relpath!r}; have {sorted(sources)}")
    return sources[relpath]


def materialize(subdir: str) -> Path:
    """Write every source under `subdir` to a directory named by their content hash and return it.

    The same text always lands in the same directory, so a JIT build cache keyed on it stays valid,
    and a changed kernel can never be served from a stale directory.
    """
    prefix = subdir.rstrip("/") + "/"
    files = {k[len(prefix):]: v for k, v in _all_sources().items() if k.startswith(prefix)}
    if not files:
        raise FileNotFoundError(f"no kernel sources under {subdir!r}")
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    root = Path(os.environ.get("MLA_KERNEL_CACHE", Path(tempfile.gettempdir()) / "mixed_mla_kernels"))
    target = root / f"{subdir.replace('/', '_')}-{digest.hexdigest()[:16]}"
    if not target.exists():
        staging = Path(tempfile.mkdtemp(dir=root.mkdir(parents=True, exist_ok=True) or root))
        for name, text in files.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_text(text)
        try:
            staging.rename(target)
        except OSError:  # another process won the race; its copy has the same content
            pass
    return target


def jit_build(kernel_dir: str, cuda_files, cuda_flags, functions=("forward",), **load_inline_args):
    """Build `kernel_dir`'s binding.cpp (exporting `functions`) with its device files through torch's load_inline.

    The module name carries the sources' content hashes (its own and the shared COMMON_DIR's), so a changed kernel
    rebuilds instead of loading a stale extension from torch's build cache; the directories from `materialize`
    serve the files' #includes.
    """
    from torch.utils.cpp_extension import load_inline
    include_dir = materialize(kernel_dir)
    common_dir = materialize(COMMON_DIR)
    return load_inline(
        name=f"mixed_mla_{kernel_dir.replace('/', '_')}_{include_dir.name.rsplit('-', 1)[-1]}"
             f"_{common_dir.name.rsplit('-', 1)[-1]}",
        cpp_sources=[read(f"{kernel_dir}/binding.cpp")],
        cuda_sources=[read(f"{kernel_dir}/{name}") for name in cuda_files],
        functions=list(functions),
        extra_include_paths=[str(include_dir), str(common_dir)],
        extra_cuda_cflags=list(cuda_flags) + ["-O3", "-std=c++17"],
        **load_inline_args,
    )
