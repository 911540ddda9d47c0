"""tools/check_tolerances.py on the CPU: the problem's two tolerances and the strict check, per format and path."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import check_tolerances  # noqa: E402

from mixed_mla import api  # noqa: E402

CASE = {"batchsize": 2, "qseqlen": 1, "kvseqlen": 256, "seed": 4220}


def test_every_format_on_the_torch_path_is_reported():
    records = check_tolerances.check_case("small", CASE, ["bf16", "fp8", "mxfp4"], ["torch"])
    assert [(r.kv_format, r.path) for r in records] == [("bf16", "torch"), ("fp8", "torch"), ("mxfp4", "torch")]
    for r in records:
        assert set(r.mismatch) == set(r.passes) == {"readme", "reference"}
        assert r.strict_passes and r.passes["reference"]
        assert r.mismatch["readme"] >= r.mismatch["reference"]   # the README's tolerance is the stricter one
    assert "| small | fp8 | torch |" in check_tolerances.table(records)


def test_a_zero_output_fails_the_stricter_tolerance_and_the_strict_check(monkeypatch):
    """Negative case: at 256 tokens zeros mismatch on most elements under rtol 2e-2 / atol 8e-3."""
    monkeypatch.setattr(api, "decode", lambda q, *args, **kwargs: torch.zeros(q.shape[0], q.shape[1], 512,
                                                                              dtype=torch.bfloat16))
    (record,) = check_tolerances.check_case("small", CASE, ["fp8"], ["torch"])
    assert not record.passes["readme"] and not record.strict_passes
    assert record.mismatch["readme"] > record.mismatch["reference"]


def test_the_command_line_writes_json(tmp_path):
    out = tmp_path / "records.json"
    records = check_tolerances.main(["--cases", "tests_cpu.txt", "--formats", "fp8", "--paths", "torch",
                                     "--json", str(out)])
    assert len(records) == len(Path("tests_cpu.txt").read_text().splitlines()) and out.read_text().startswith("[")
