#!/usr/bin/env python3
"""dpcheck.torch's trace read by dpcheck diff: two runs of the example DDP job on the same ranks agree
bit for bit at every step; on 3 ranks against 2 they part at step 0's all-reduce (different sums of the
same examples); and a trace path that exists is refused, the file left as it was.

    trace_test.py    (environment: PYTHONPATH holding the built package; DPCHECK, the dpcheck binary)
"""

import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = os.path.join(ROOT, "python", "examples", "ddp_mlp.py")


def run(cmd, cwd):
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print("$ " + " ".join(cmd) + f"  (exit {r.returncode})\n" + r.stdout)
    return r


def main() -> int:
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, ranks in (("a2.jsonl", 2), ("b2.jsonl", 2), ("c3.jsonl", 3)):
            r = run([sys.executable, "-m", "dpcheck.launch", "--nproc", str(ranks), "--timeout", "240", "--preload",
                     "torch", JOB, "--steps", "3", "--trace", name], tmp)
            if r.returncode != 0:
                problems.append(f"the job on {ranks} ranks exited {r.returncode}")
        same = run([os.environ["DPCHECK"], "diff", "a2.jsonl", "b2.jsonl"], tmp)
        if same.returncode != 0 or "identical" not in same.stdout:
            problems.append("two runs on 2 ranks are not reported identical")
        apart = run([os.environ["DPCHECK"], "diff", "c3.jsonl", "a2.jsonl"], tmp)
        if apart.returncode != 1 or "first difference: step 0, all-reduce, rank 0, reduced_grad 0.weight" not in apart.stdout:
            problems.append("3 ranks against 2 do not part at step 0's all-reduce")
        before = open(os.path.join(tmp, "a2.jsonl")).read()
        again = run([sys.executable, "-m", "dpcheck.launch", "--nproc", "1", JOB, "--steps", "1", "--trace", "a2.jsonl"],
                    tmp)
        if again.returncode == 0 or "the file exists" not in again.stdout:
            problems.append("an existing trace was not refused")
        if open(os.path.join(tmp, "a2.jsonl")).read() != before:
            problems.append("an existing trace was changed")
    print("; ".join(problems) if problems else "trace: as expected")
    print("1 passed, 0 failed" if not problems else "0 passed, 1 failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
