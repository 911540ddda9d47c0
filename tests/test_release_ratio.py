"""benchmarks.sm90.release_ratio: the release check's verdict line is read from the two files of one run."""
import pytest

from benchmarks.sm90.release_ratio import ratio_line


def write_run(folder, eval_text, probe_text):
    (folder / "protocol").mkdir()
    (folder / "eval_benchmark.txt").write_text(eval_text)
    (folder / "protocol" / "probe.txt").write_text(probe_text)


def test_ratio_is_eval_geomean_over_the_dirty_fp8_read(tmp_path):
    write_run(tmp_path, "...\ngeometric mean of means: 39.33 us (what the leaderboard ranks)\ncheck: pass\n",
              "2026-12-05; commit x\ngeomean: ours dirty 40.10, read dirty 27.00, read mxfp4 bytes dirty 17.90\n"
              "geomean fp8: kernel decode 30.00, bare read 20.00 (ratio 1.50); eval decode 1.00, bare read 99.00\n")
    line = ratio_line(tmp_path, "NVIDIA H200", "abc1234")
    assert line == ("eval.py geomean 39.33 us / fp8 bare read geomean 27.00 us (same run, NVIDIA H200, abc1234) "
                    "= 1.457")


def test_a_missing_number_is_an_error_not_a_ratio(tmp_path):
    write_run(tmp_path, "geometric mean of means: 39.33 us\n", "geomean fp8: kernel decode 30.00\n")
    with pytest.raises(SystemExit, match="read dirty"):
        ratio_line(tmp_path, "NVIDIA H200", "abc1234")
