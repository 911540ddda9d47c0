"""The leaderboard's cases under the strict bound: what eval.py's own check cannot say.

    python tools/strict_cases.py tests.txt --results strict-test.jsonl --outputs outputs/strict-test

eval.py's verdict is the leaderboard's check (rtol = atol = 0.1, 5% mismatches allowed), which an all-zero output
passes at kv 8192. This runs the same cases (a case file of eval.py's, parsed by eval.py) once each through
submission.custom_kernel on the data reference.generate_input makes, keeps each output (torch.save, in --outputs),
and checks it with mixed_mla.exact.check_strict: relative L2 against exact float64 attention on the cache format the
plan read (the oracle's own decoders, not the library's), under STRICT_BOUND of the path that ran. The plan is the
one custom_kernel used for the case's layout. One JSON line per case goes to --results as it is made (a later crash
keeps the earlier lines): the plan's configuration (mi355x_bringup.CONFIGURATION), the strict error and bound,
the strict verdict and, beside it, the leaderboard's. Exits 1 unless every case passed strictly.

Test equipment for tools/mi355x_bringup.py: nothing here ships in submission.py.
"""
import argparse
import sys
from pathlib import Path

import torch

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
sys.path[:0] = [str(REPO), str(TOOLS)]

from eval import check, clone_data, get_test_cases  # noqa: E402  (the leaderboard's check and case parser)
from mi355x_bringup import configuration, write_record  # noqa: E402
from mixed_mla import exact  # noqa: E402
from reference import generate_input  # noqa: E402
from utils import synchronize  # noqa: E402


def submission_kernel(data):
    """(output, the Plan it ran) of submission.custom_kernel on `data`."""
    from submission import custom_kernel
    output = custom_kernel(data)
    # entry.py's bounded cache of planned layouts puts the layout a call used last (inserted or moved to the end)
    planned = custom_kernel.__globals__["_plans"]
    return output, next(reversed(planned.values())).plan


def judge(data, output, plan) -> dict:
    """The strict verdict on one output of `plan` (and the leaderboard's, for contrast)."""
    q, kv_data, qo_indptr, kv_indptr, config = data
    passed, error, bound = exact.check_strict(output, q, kv_data[plan.kv_format], plan.kv_format, qo_indptr,
                                              kv_indptr, config["sm_scale"], plan.backend)
    lax_passed, _ = check(data, output)
    return {"passed": bool(passed), "error": error, "bound": bound, "lax_passed": bool(lax_passed)}


def check_cases(case_file: str, results: Path, outputs: Path, kernel=submission_kernel) -> int:
    """Every case of `case_file` once through `kernel` ((output, Plan) of the data), judged strictly: one JSON line
    per case appended to `results` (emptied first), each output saved in `outputs`. 0 when every case passed."""
    results.parent.mkdir(parents=True, exist_ok=True)
    outputs.mkdir(parents=True, exist_ok=True)
    results.write_text("")
    all_passed = True
    for idx, case in enumerate(get_test_cases(case_file, None)):
        data = generate_input(**case.args)
        record = {"case": idx, "spec": case.spec}
        try:
            output, plan = kernel(clone_data(data))   # the kernel may not touch what the oracle reads
            synchronize()
            record.update(configuration(plan))
            saved = outputs / f"case-{idx}.pt"
            torch.save(output.cpu(), saved)
            record.update(output=str(saved), **judge(data, output, plan))
        except Exception as error:   # one case's failure is that case's verdict; the next case still runs
            record.update(passed=False, problem=f"{type(error).__name__}: {error}")
        all_passed &= record["passed"]
        write_record(record, results)
    return 0 if all_passed else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("case_file", help="a case file of eval.py's (tests.txt, benchmarks.txt)")
    parser.add_argument("--results", type=Path, required=True, help="JSON lines, one per case")
    parser.add_argument("--outputs", type=Path, required=True, help="folder for each case's output (torch.save)")
    args = parser.parse_args(argv)
    return check_cases(args.case_file, args.results, args.outputs)


if __name__ == "__main__":
    sys.exit(main())
