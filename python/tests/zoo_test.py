#!/usr/bin/env python3
"""Runs one script of the zoo (python/zoo/) as a real DDP job over gloo and holds it to what the check
aimed at it must say: the planted bug caught with a located message, the fixed version passed.

    zoo_test.py NAME bug|correct    (environment: PYTHONPATH holding the built dpcheck package;
                                     DPCHECK, the dpcheck binary, for the audited script)

Prints the job's output, then "1 passed, 0 failed" or the expectation that failed, "0 passed, 1 failed".
"""

import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ZOO = os.path.join(os.path.dirname(HERE), "zoo")

# name: (ranks, extra arguments, the check, patterns the bug's report must hold, patterns the correct
# run's output must hold). Each pattern is a regular expression over the whole output.
CASES = {
    "rank_writes": (2, [], "write audit (dpcheck audit)",
                    [r"rank 1 .*zoo-checkpoint-1\.pt", r"FAILED"],
                    [r"verdict: passed: no rank other than 0 wrote"]),
    "no_set_epoch": (3, [], "sampler shares",
                     [r"epoch 1: every rank draws exactly the order it drew in epoch 0, though the sampler shuffles",
                      r"set_epoch"],
                     [r"3 epochs of shares judged"]),
    "padding": (3, [], "sampler shares (strict)",
                [r"epoch 0: padding repeats 1 example \(\d+ \(ranks \d and \d\)\) so that the shares are equal, "
                 r"and strict shares were asked for"],
                [r"3 ranks draw 34 examples each of 101, disjoint, covering the data apart from padding: 1 example "
                 r"drawn twice", r"2 epochs of shares judged"]),
    "bn_no_broadcast": (3, [], "replicas (buffers)",
                        [r"outside the update: buffer 1\.running_mean differed at the start of step 1's forward pass",
                         r"first difference: buffer 1\.running_mean\[0\]", r"<- minority",
                         r"largest distance from the majority value: \d+ ulp"],
                        [r"replicas bitwise identical after every step",
                         r"gradient not judged: module 1 is a BatchNorm1d"]),
    "param_changed_one_rank": (3, [], "replicas (outside the step)",
                               [r"outside the step: the parameters of rank 2 changed between the end of step 1 and "
                                r"the start of step 2's forward pass",
                                r"first difference: parameters 2\.weight\[\d+, \d+\]",
                                r"rank 2: .*<- minority", r"ranks in the minority: 2;"],
                               [r"replicas bitwise identical after every step", r"2 gradient checks"]),
    "uneven_loss": (3, [], "gradient (share weights)",
                    [r"gradient at step 0: .*error ratio [0-9.e+]+ at ",
                     r"the examples' weights differ: rank 0 \(4 examples\) 1/12; rank 1 \(3 examples\) 1/9; "
                     r"rank 2 \(3 examples\) 1/9, where the whole batch's mean weighs each 1/10"],
                    [r"4 gradient checks, largest error ratio 0?\.\d+"]),
    "accumulation": (3, [], "gradient (micro-batch weights)",
                     [r"the examples' weights differ: rank 0 micro-batch 0 \(3 examples\) 1/18; rank 0 micro-batch 1 "
                      r"\(2 examples\) 1/12", r"where the whole batch's mean weighs each 1/15"],
                     [r"4 gradient checks, largest error ratio 0?\.\d+"]),
    "resume_one_rank": (3, [], "replicas (optimizer state)",
                        [r"in the optimizer's state at step 0: the gradients were the same on every rank",
                         r"first difference: optimizer state momentum_buffer of 0\.weight\[0, 0\]",
                         r"rank 0: .*<- minority"],
                        [r"replicas bitwise identical after every step", r"4 gradient checks"]),
}


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in CASES or sys.argv[2] not in ("bug", "correct"):
        print(f"usage: zoo_test.py {{{'|'.join(CASES)}}} bug|correct", file=sys.stderr)
        return 2
    name, version = sys.argv[1], sys.argv[2]
    ranks, extra, check, bug_patterns, correct_patterns = CASES[name]
    script = os.path.join(ZOO, name + ".py")
    args = extra + (["--correct"] if version == "correct" else [])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), ZOO) if p)
    with tempfile.TemporaryDirectory() as tmp:
        # Ranks forked from a launcher that imported torch once, but under the audit, which counts the
        # processes as they start, each its own interpreter.
        preload = [] if name == "rank_writes" else ["--preload", "torch"]
        launch = [sys.executable, "-m", "dpcheck.launch", "--nproc", str(ranks), "--timeout", "240", *preload, script,
                  *args]
        if name == "rank_writes":
            launch = [os.environ["DPCHECK"], "audit", "--", *launch, "--out", tmp]
        run = subprocess.run(launch, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(run.stdout)
    want_status = 0 if version == "correct" else 1
    problems = []
    if run.returncode != want_status:
        problems.append(f"exit status {run.returncode}, expected {want_status}")
    for pattern in (correct_patterns if version == "correct" else bug_patterns):
        if not re.search(pattern, run.stdout):
            problems.append(f"the output lacks /{pattern}/")
    if version == "correct" and "FAILED" in run.stdout:
        problems.append("the correct version's output says FAILED")
    print(f"zoo: {name} ({version}), caught by {check}: " + ("as expected" if not problems else "; ".join(problems)))
    print("1 passed, 0 failed" if not problems else "0 passed, 1 failed")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
