"""submission.py is a fresh bundle of the package, imports with only task.py beside it, and coexists with the
repository's mixed_mla in one process."""
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mixed_mla import exact

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bundle_tool", ROOT / "tools" / "bundle.py")
bundle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bundle)


def test_committed_submission_is_a_fresh_bundle():
    problem = bundle.staleness(ROOT / "submission.py", bundle.bundle_text())
    assert problem is None, problem


def test_header_lines_come_first():
    assert bundle.bundle_text().splitlines()[:2] == ["#!POPCORN leaderboard amd-mixed-mla", "#!POPCORN gpu MI355X"]


def test_every_module_kernel_and_table_is_embedded():
    namespace = {}
    text = bundle.bundle_text()
    # Execute only the data blocks: everything from the module table to the footer.
    exec(text[text.index("_MODULES = {}"):text.index("importlib.import_module(_PACKAGE")], namespace)
    package = ROOT / "mixed_mla"
    assert set(namespace["_MODULES"]) == {p.relative_to(package).as_posix() for p in package.rglob("*.py")
                                          if "__pycache__" not in p.parts}
    kernel_files = {p.relative_to(package / "kernels").as_posix() for p in (package / "kernels").rglob("*")
                    if p.suffix in bundle.KERNEL_SUFFIXES}
    assert set(namespace["_KERNEL_SOURCES"]) == kernel_files
    assert set(namespace["_TABLES"]) == {p.name for p in (package / "tables").glob("*.json")}
    for relpath, text in namespace["_MODULES"].items():
        assert text == (package / relpath).read_text()


@pytest.mark.parametrize("text", ["plain\n", "a '''quote'''\n", "ends with a backslash\\", "crlf\r\n", "it's'",
                                  'tab\tand "double" quotes\n', "\\n stays two characters\n"])
def test_literals_round_trip(text):
    assert eval(bundle._literal(text)) == text


_CHILD = """
import sys, torch
sys.path[:] = [p for p in sys.path if p != {root!r}]  # '' (the temporary directory) stays
import submission
assert not any(name == 'mixed_mla' or name.startswith('mixed_mla.') for name in sys.modules), 'used the repo'
q, kv, qo, kvp, config = torch.load({inputs!r})
torch.save(submission.custom_kernel((q, {{'bf16': kv}}, qo, kvp, config)), {output!r})
"""


def test_submission_runs_with_only_task_py_beside_it(tmp_path, make_case):
    for name in ("submission.py", "task.py"):
        shutil.copy(ROOT / name, tmp_path / name)
    case = make_case([1, 2], [100, 37])
    config = {"batch_size": 2, "num_heads": 16, "q_seq_len": 2, "kv_seq_len": 100, "sm_scale": 0.05}
    torch.save((case.q, case.kv_bf16, case.qo_indptr, case.kv_indptr, config), tmp_path / "inputs.pt")
    child = _CHILD.format(root=str(ROOT), inputs=str(tmp_path / "inputs.pt"), output=str(tmp_path / "out.pt"))
    env = {"PATH": "/usr/bin:/bin", "MLA_KV_FORMAT": "bf16", "HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", child], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    out = torch.load(tmp_path / "out.pt")
    assert exact.strict_error(out, case.q, case.kv_bf16, "bf16", case.qo_indptr, case.kv_indptr, 0.05) < 0.003


def test_submission_and_the_repository_package_coexist():
    code = ("import sys; sys.path.insert(0, {root!r}); import mixed_mla.api, mixed_mla.kernels, submission; "
            "import mixed_mla; embedded = sys.modules[submission._PACKAGE]; "
            "assert embedded is not mixed_mla and submission.custom_kernel.__module__ != 'mixed_mla.entry'; "
            "assert embedded.kernels._EMBEDDED is not mixed_mla.kernels._EMBEDDED; print('ok')").format(root=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
