"""What a run measured and where its results go: the commit, the device and software, the results folder.

Results live in benchmarks/results/<kind>/ (release, peers, protocol, host, planner, format_error): one folder per
kind, holding the latest run only. A new run replaces the folder (a probe: its file); git keeps the history, and the
commit message says what changed.
"""
import datetime
import os
import platform
import shutil
import subprocess
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


def results_dir(kind: str) -> Path:
    """benchmarks/results/<kind>/, emptied for a new run."""
    folder = RESULTS / kind
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def publish(lines, kind: str, name: str, out=None) -> Path:
    """Prints a probe's report and writes it, under the run's date and commit, to <out>/<name>.txt (default
    benchmarks/results/<kind>/, where it replaces the last run's file)."""
    text = "\n".join([f"{utc_now()}; commit {git_commit()}", *lines]) + "\n"
    print(text, end="")
    folder = Path(out) if out is not None else RESULTS / kind
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.txt").write_text(text)
    return folder / f"{name}.txt"


def git_commit() -> str:
    """The measured commit: MLA_COMMIT when set (a GPU machine that gets the tree without .git), else git's."""
    if os.environ.get("MLA_COMMIT"):
        return os.environ["MLA_COMMIT"]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def gpu_name(device) -> str:
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def environment(device, **extra) -> dict:
    """The run's date, commit, software and device, plus `extra` fields."""
    device = torch.device(device)
    env = {"date_utc": utc_now(), "commit": git_commit(), "python": platform.python_version(),
           "torch": torch.__version__, "cuda": torch.version.cuda, "device": str(device), **extra}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, sm_count=props.multi_processor_count, l2_bytes=props.L2_cache_size,
                   memory_GiB=round(props.total_memory / 2**30, 1), driver=_nvidia_smi("driver_version"))
    else:
        env.update(gpu="none (CPU)", cpu=platform.processor() or platform.machine())
    return env


def _nvidia_smi(field):
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True,
                              text=True, check=True).stdout.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown"
