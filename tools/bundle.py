"""Write submission.py: the mixed_mla package, its kernel sources and planner tables in one importable file.

    python tools/bundle.py            # (re)write submission.py at the repository root
    python tools/bundle.py --check    # exit 1 when the committed submission.py differs from a fresh bundle

The file registers the package under a private top-level name that carries a hash of its contents, so it never
collides with the repository's `mixed_mla` (or with another bundle) in one process, then fills the kernel and
table registries and exposes `custom_kernel`. It needs nothing beside it but torch (and task.py for the harness).
The output is a pure function of the files bundled (sorted, no dates, no commit ids), so --check is exact.

Only what runs is bundled, by one rule: the modules in the import closure of entry.py (custom_kernel) and of every
registered backend module (backends.REGISTRY, imported by name), with the __init__.py of their packages; the
kernel sources under each registered backend's kernel_dir (its BackendSpec); the planner tables. Test equipment
inside the package (an emulator, a twin, a model) is not imported by those, so it is not bundled.
"""
import argparse
import ast
import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = ROOT / "mixed_mla"
SUBMISSION = ROOT / "submission.py"
HEADER = "#!POPCORN leaderboard amd-mixed-mla\n#!POPCORN gpu MI355X\n"

sys.path.insert(0, str(ROOT))
from mixed_mla import backends  # noqa: E402
from mixed_mla.kernels import COMMON_DIR, SOURCE_SUFFIXES as KERNEL_SUFFIXES  # noqa: E402  (the one list of them)

RUNTIME_ROOT = "entry.py"   # custom_kernel's module: what the submission's footer imports

_IMPORTER = '''
import importlib.abc
import importlib.util
import linecache
import sys


class _EmbeddedPackage(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports _PACKAGE and its submodules from _MODULES (relative intra-package imports resolve through it)."""

    def _relpath(self, fullname):
        if fullname != _PACKAGE and not fullname.startswith(_PACKAGE + "."):
            return None
        parts = fullname.split(".")[1:]
        for relpath in ("/".join(parts + ["__init__.py"]), "/".join(parts) + ".py"):
            if relpath in _MODULES:
                return relpath
        return None

    def find_spec(self, fullname, path=None, target=None):
        relpath = self._relpath(fullname)
        if relpath is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=relpath.endswith("__init__.py"))

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        relpath = self._relpath(module.__name__)
        source = _MODULES[relpath]
        module.__file__ = f"<{_PACKAGE}>/{relpath}"
        linecache.cache[module.__file__] = (len(source), None, source.splitlines(True), module.__file__)  # tracebacks
        exec(compile(source, module.__file__, "exec"), module.__dict__)


if _PACKAGE not in sys.modules:
    sys.meta_path.insert(0, _EmbeddedPackage())
'''

_FOOTER = '''
importlib.import_module(_PACKAGE + ".kernels")._EMBEDDED.update(_KERNEL_SOURCES)
importlib.import_module(_PACKAGE + ".planner")._EMBEDDED_TABLES = dict(_TABLES)
custom_kernel = importlib.import_module(_PACKAGE + ".entry").custom_kernel
'''


def _files(directory: Path, keep) -> dict:
    """relative posix path -> text of the files under `directory` that `keep(path)` accepts, sorted."""
    found = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and keep(path):
            found[path.relative_to(directory).as_posix()] = path.read_text()
    return found


def _literal(text: str) -> str:
    """A Python literal for `text`: a readable raw triple-quoted string when that round-trips, else repr."""
    literal = "r'''" + text + "'''"
    safe = "'''" not in text and not text.endswith(("\\", "'")) and "\r" not in text
    if not safe or ast.literal_eval(literal) != text:
        literal = repr(text)
    return literal


def _table_block(name: str, files: dict) -> str:
    lines = [f"{name} = {{}}"]
    lines += [f"{name}[{path!r}] = {_literal(text)}" for path, text in files.items()]
    return "\n".join(lines) + "\n"


def _relative_imports(relpath: str, source: str) -> set:
    """Package-relative paths of the modules that `from .x import y` / `from . import x` statements import."""
    package = relpath.split("/")[:-1]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        base = package[:len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
        candidates = [base] + [base + [alias.name] for alias in node.names]   # `from . import x`: x may be a module
        for parts in candidates:
            for path in ("/".join(parts + ["__init__.py"]), "/".join(parts) + ".py"):
                if (PACKAGE_DIR / path).is_file():
                    found.add(path)
    return found


def runtime_modules() -> dict:
    """relative path -> text of every module custom_kernel can import (the rule in this file's docstring)."""
    pending = [RUNTIME_ROOT, "backends/__init__.py"]
    pending += [f"backends/{module}.py" for module in backends.REGISTRY.values()]
    modules = {}
    while pending:
        relpath = pending.pop()
        if relpath in modules:
            continue
        modules[relpath] = (PACKAGE_DIR / relpath).read_text()
        parts = relpath.split("/")
        pending += ["/".join(parts[:depth] + ["__init__.py"]) for depth in range(len(parts))]   # its packages
        pending += sorted(_relative_imports(relpath, modules[relpath]))
    return dict(sorted(modules.items()))


def runtime_kernel_dirs() -> tuple:
    """The kernel directories (under mixed_mla/kernels/) the registered backends build, and the one they share."""
    built = {backends.spec(name).kernel_dir for name in backends.BACKEND_NAMES} - {None}
    return tuple(sorted(built | {COMMON_DIR}))


def bundle_text() -> str:
    modules = runtime_modules()
    kernel_dirs = runtime_kernel_dirs()
    kernels = _files(PACKAGE_DIR / "kernels", lambda p: p.suffix in KERNEL_SUFFIXES and any(
        p.relative_to(PACKAGE_DIR / "kernels").as_posix().startswith(d + "/") for d in kernel_dirs))
    tables = _files(PACKAGE_DIR / "tables", lambda p: p.suffix == ".json") if (PACKAGE_DIR / "tables").is_dir() else {}
    digest = hashlib.sha256()
    for group in (modules, kernels, tables):
        for path, text in group.items():
            digest.update(path.encode() + b"\0" + text.encode() + b"\0")
    package = f"_mixed_mla_{digest.hexdigest()[:12]}"
    doc = ('"""mixed-mla MLA decode for the GPU MODE `amd-mixed-mla` problem, as one file.\n\n'
           'GENERATED by tools/bundle.py from the mixed_mla package: do not edit. To regenerate after changing the\n'
           'package: `python tools/bundle.py` (CI fails while this file differs: `python tools/bundle.py --check`).\n'
           'It holds only what runs: the modules custom_kernel imports, the sources of the kernels the backends\n'
           'build, the planner tables.\n'
           f'{len(modules)} modules, {len(kernels)} kernel sources, {len(tables)} planner tables. The package is '
           f'registered as {package}.\n"""\n')
    return "\n".join([
        HEADER + doc,
        f"_PACKAGE = {package!r}",
        _IMPORTER,
        "# mixed_mla/<path> -> source",
        _table_block("_MODULES", modules),
        "# mixed_mla/kernels/<path> -> source (kernels.read / kernels.materialize serve these)",
        _table_block("_KERNEL_SOURCES", kernels),
        "# mixed_mla/tables/<file> -> JSON (the planner's measured tables)",
        _table_block("_TABLES", tables),
        _FOOTER.lstrip("\n"),
    ])


def staleness(path: Path, fresh: str):
    """None when `path` holds exactly `fresh`, else a one-line explanation."""
    current = path.read_text() if path.exists() else ""
    if current == fresh:
        return None
    new_lines, old_lines = fresh.splitlines(), current.splitlines()
    line = next((i for i, (a, b) in enumerate(zip(new_lines, old_lines)) if a != b), min(len(new_lines), len(old_lines)))
    return (f"{path} is stale (first difference at line {line + 1}): run `python tools/bundle.py` and commit the "
            f"result")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when submission.py is not a fresh bundle")
    parser.add_argument("--output", type=Path, default=SUBMISSION, help="where to write (default: submission.py)")
    args = parser.parse_args(argv)
    text = bundle_text()
    if args.check:
        problem = staleness(args.output, text)
        if problem:
            print(problem, file=sys.stderr)
        return 1 if problem else 0
    args.output.write_text(text)
    print(f"wrote {args.output} ({len(text) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
