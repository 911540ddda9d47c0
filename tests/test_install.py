"""The package installs: a wheel built from the repository's tracked package files goes into a fresh venv, and the
smoke test (tests/install_smoke.py) passes there from outside the repository.

The wheel is the pure-Python one (MLA_BUILD_KERNELS=0; setup.py); the kernels built ahead of time are built and
loaded on a GPU machine (docs/design.md#built-kernels). Fast by reuse: the wheel is built with this interpreter's
setuptools (no build isolation, no network), the venv has no pip of its own and sees the system's site packages
(--system-site-packages) and this interpreter's through a .pth file (torch is not reinstalled), and the wheel goes in
with --no-deps. Only the package and its data are under test
here, not dependency resolution.
"""
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMOKE = Path(__file__).resolve().parent / "install_smoke.py"
# what a clone holds of the package: the tracked files only (git ls-files), so untracked build output never ships
PACKAGE_PATHS = ("pyproject.toml", "setup.py", "LICENSE", "README.md", "mixed_mla")


def _run(args, cwd, **kwargs):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}   # nothing may reach the repository's package
    env["MLA_BUILD_KERNELS"] = "0"   # the pure-Python wheel, even where a CUDA torch could build the kernels (setup.py)
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, args))} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _tracked_copy(target: Path) -> None:
    listed = _run(["git", "ls-files", "-z", *PACKAGE_PATHS], ROOT).split("\0")
    for relpath in filter(None, listed):
        destination = target / relpath
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_bytes((ROOT / relpath).read_bytes())


def test_the_built_wheel_installs_into_a_fresh_venv_and_runs(tmp_path):
    source, dist, venv, outside = (tmp_path / name for name in ("source", "dist", "venv", "outside"))
    _tracked_copy(source)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), "."],
         source)
    wheel, = dist.glob("mixed_mla-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert top_level == {"mixed_mla", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}, \
        f"the wheel must hold the package alone, got {sorted(top_level)}"

    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    site_packages = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              tmp_path).strip())
    (site_packages / "reuse_parent.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([python, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], tmp_path)
    outside.mkdir()
    output = _run([python, str(SMOKE), str(ROOT / "mixed_mla")], outside)
    assert "install smoke passed" in output and str(venv) in output
