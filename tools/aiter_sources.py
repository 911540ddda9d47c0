"""aiter's Python sources without a ROCm machine: the `amd-aiter` wheel from PyPI, or an installed / checked-out aiter.

aiter only runs on ROCm, but its wheel holds the Python sources, which is all the API contract test needs: the
signatures of the functions the aiter route calls, read with `ast` (nothing of aiter is imported or executed).

    python tools/aiter_sources.py            # download (cached), print the wheel's version and the signatures
    python tools/aiter_sources.py --unpack   # also write the files the contract test reads to .build/aiter_sources/

The wheel (~40 MB) is cached under .build/aiter_wheel/ (git-ignored). `pip download` runs on every call so a newer
release on PyPI replaces the cached one; when PyPI cannot be reached, the newest cached wheel is used. scripts/setup-env
runs --unpack, so CI's tests/test_aiter_contract.py reads aiter's sources from .build/aiter_sources/ (data, not code we
ship or import) when MLA_AITER_SOURCES names no other checkout.
"""
import ast
import importlib.util
import inspect
import re
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WHEEL_CACHE = REPO / ".build" / "aiter_wheel"
SOURCES_DIR = REPO / ".build" / "aiter_sources"   # the FUNCTION_FILES of the newest wheel, as a tree
PACKAGE = "amd-aiter"
# Where the functions the aiter route calls are defined, as the route imports them:
# aiter.mla.mla_decode_fwd, and aiter.get_mla_metadata_* (re-exported by aiter/__init__.py from ops/attention.py).
FUNCTION_FILES = {"mla_decode_fwd": "aiter/mla.py",
                  "get_mla_metadata_info_v1": "aiter/ops/attention.py",
                  "get_mla_metadata_v1": "aiter/ops/attention.py"}
_NO_DEFAULT_VALUE = "<default>"   # defaults are not evaluated, only their presence matters


def _version_key(wheel: Path):
    """Sortable version from a wheel file name: amd_aiter-0.1.7.post2.dev18-py3-none-any.whl -> (0, 1, 7, 2, 18)."""
    version = wheel.name.split("-")[1]
    return tuple(int(n) for n in re.findall(r"\d+", version))


def download_wheel(cache: Path = WHEEL_CACHE) -> Path:
    """The newest amd-aiter wheel: downloaded into `cache` (pip reuses a file already there), else the cached one."""
    cache.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                             "--quiet", PACKAGE, "-d", str(cache)], capture_output=True, text=True)
    wheels = sorted(cache.glob("amd_aiter-*.whl"), key=_version_key)
    if not wheels:
        raise RuntimeError(f"no {PACKAGE} wheel: `pip download {PACKAGE}` failed and {cache} holds none:\n"
                           f"{result.stderr.strip()}")
    return wheels[-1]


def wheel_sources(wheel: Path) -> dict:
    """{relative path: text} of the files in FUNCTION_FILES, read from the wheel (a zip) without unpacking it."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        return {path: archive.read(path).decode() for path in set(FUNCTION_FILES.values()) if path in names}


def unpack(wheel: Path, dest: Path = SOURCES_DIR) -> Path:
    """Writes the wheel's FUNCTION_FILES under `dest` (a tree tree_sources reads), with the wheel's name beside them."""
    for path, text in wheel_sources(wheel).items():
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).write_text(text)
    (dest / "WHEEL").write_text(wheel.name + "\n")
    return dest


def tree_sources(root: Path) -> dict:
    """The same files from a directory that holds the `aiter` package (site-packages, or a source checkout)."""
    return {path: (root / path).read_text() for path in set(FUNCTION_FILES.values()) if (root / path).is_file()}


def installed_root():
    """The directory holding an installed aiter package with MLA sources, or None (no import is executed).

    PyPI's unrelated `aiter` (asyncio iterators) has no mla.py, so it is not mistaken for AMD's.
    """
    spec = importlib.util.find_spec("aiter")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]).parent
    return root if (root / FUNCTION_FILES["mla_decode_fwd"]).is_file() else None


def _parameters(arguments: ast.arguments):
    kinds = inspect.Parameter
    positional = [(a, kinds.POSITIONAL_ONLY) for a in arguments.posonlyargs]
    positional += [(a, kinds.POSITIONAL_OR_KEYWORD) for a in arguments.args]
    first_default = len(positional) - len(arguments.defaults)
    params = [kinds(a.arg, kind, default=_NO_DEFAULT_VALUE if i >= first_default else kinds.empty)
              for i, (a, kind) in enumerate(positional)]
    if arguments.vararg:
        params.append(kinds(arguments.vararg.arg, kinds.VAR_POSITIONAL))
    for a, default in zip(arguments.kwonlyargs, arguments.kw_defaults):
        params.append(kinds(a.arg, kinds.KEYWORD_ONLY, default=kinds.empty if default is None else _NO_DEFAULT_VALUE))
    if arguments.kwarg:
        params.append(kinds(arguments.kwarg.arg, kinds.VAR_KEYWORD))
    return params


def function_signature(source: str, name: str) -> inspect.Signature:
    """The signature of the top-level function `name` in `source`; KeyError when it is not defined there."""
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return inspect.Signature(_parameters(node.args))
    raise KeyError(name)


def signatures(sources: dict) -> dict:
    """{function name: inspect.Signature} for FUNCTION_FILES; a missing file or function raises KeyError."""
    found = {}
    for name, path in FUNCTION_FILES.items():
        if path not in sources:
            raise KeyError(f"{path} is missing from these aiter sources")
        try:
            found[name] = function_signature(sources[path], name)
        except KeyError:
            raise KeyError(f"{name} is not defined at the top level of {path}") from None
    return found


def main():
    wheel = download_wheel()
    print(f"{wheel.name} ({wheel.stat().st_size / 2**20:.1f} MiB, cached in {wheel.parent})")
    if "--unpack" in sys.argv[1:]:
        print(f"sources of {', '.join(sorted(set(FUNCTION_FILES.values())))} written to {unpack(wheel)}")
    for name, signature in signatures(wheel_sources(wheel)).items():
        print(f"{name}{signature}")


if __name__ == "__main__":
    main()
