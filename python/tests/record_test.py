#!/usr/bin/env python3
"""dpcheck.torch's records and repro bundles, read by dpcheck replay and dpcheck drift, on real DDP jobs:

- the zoo's uneven loss leaves a repro bundle of its failing step; replay holds the recorded all-reduce
  out of the bound, names the weights, and runs dpcheck's trainer on the same step, which passes;
  the fixed version leaves no bundle;
- the example job recorded on 2 ranks and on 4 is rounding to drift (exit 0), with every step judged;
  with Adam too, whose recorded update is held to the formula;
- a planted learning rate on rank 1 fails the job's replica check, and drift names it (exit 1);
- a recorded step whose update was changed (params_after.npy) or whose parameters changed between two
  steps is a bug to replay and drift, naming the phase and the element;
- a record that exists is refused and left as it was.

    record_test.py    (environment: PYTHONPATH holding the built package; DPCHECK, the dpcheck binary)
"""

import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = os.path.join(ROOT, "python", "examples", "ddp_mlp.py")
UNEVEN = os.path.join(ROOT, "python", "zoo", "uneven_loss.py")


def run(cmd, cwd):
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print("$ " + " ".join(cmd) + f"  (exit {r.returncode})\n" + r.stdout)
    return r


def job(ranks, script, *args, cwd):
    return run([sys.executable, "-m", "dpcheck.launch", "--nproc", str(ranks), "--timeout", "240", "--preload", "torch",
                script, *args], cwd)


def dpcheck(*args, cwd):
    return run([os.environ["DPCHECK"], *args], cwd)


def main() -> int:
    problems = []

    def expect(ok, what):
        if not ok:
            problems.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        # A repro bundle of the failing step, replayed.
        os.mkdir(os.path.join(tmp, "bundles"))
        r = job(3, UNEVEN, "--steps", "2", "--bundle-dir", "bundles", cwd=tmp)
        expect(r.returncode == 1, "the uneven loss did not fail")
        bundle = os.path.join("bundles", "dpcheck-bundle-step-00000000")
        expect(f"repro bundle {bundle}; replay it with: dpcheck replay {bundle}" in r.stdout,
               "the job did not name its repro bundle")
        expect(os.listdir(os.path.join(tmp, "bundles")) == ["dpcheck-bundle-step-00000000"],
               "not exactly one bundle (the job stops at its first failure)")
        rep = dpcheck("replay", bundle, cwd=tmp)
        expect(rep.returncode == 1, "replay of the bundle did not exit 1")
        for words in ("first phase out of the bound: all-reduce at 0.weight[",
                      "rank 0 (4 examples) 1/12; rank 1 (3 examples) 1/9",
                      "dpcheck's trainer passes every check on this step",
                      "the failure is the job's (its loss, its all-reduce or its optimizer)"):
            expect(words in rep.stdout, f"replay of the bundle lacks: {words}")
        os.mkdir(os.path.join(tmp, "fixed"))
        r = job(3, UNEVEN, "--steps", "2", "--correct", "--bundle-dir", "fixed", cwd=tmp)
        expect(r.returncode == 0 and os.listdir(os.path.join(tmp, "fixed")) == [],
               "the fixed uneven loss failed or left a bundle")

        # Two real runs, 4 ranks against 2: rounding.
        for name, ranks, extra in (("run2", 2, []), ("run4", 4, []), ("adam2", 2, ["--optimizer", "adam"]),
                                   ("adam4", 4, ["--optimizer", "adam"]), ("lr4", 4, ["--lr-rank1", "0.06"])):
            r = job(ranks, JOB, "--steps", "4", "--record", name, *extra, cwd=tmp)
            expect(r.returncode == (1 if name == "lr4" else 0), f"the job {name} exited {r.returncode}")
        d = dpcheck("drift", "run2", "run4", cwd=tmp)
        expect(d.returncode == 0 and "rounding, amplified by training" in d.stdout,
               "2 ranks against 4 is not rounding")
        expect(sum(1 for line in d.stdout.splitlines() if line.strip().split(" ")[0] in "0123"
                   and "continues" in line) == 4, "drift did not judge the 4 steps")
        d = dpcheck("drift", "adam2", "adam4", cwd=tmp)
        expect(d.returncode == 0 and "rounding" in d.stdout and "not judged" not in d.stdout,
               "Adam on 2 ranks against 4 is not rounding with every update judged")
        rep = dpcheck("replay", "adam4", "--step", "3", cwd=tmp)
        expect(rep.returncode == 0 and "the recorded step stays within the bound" in rep.stdout,
               "replay of a recorded Adam step did not pass")

        # The planted learning rate: the job's own replica check, carried into the record.
        d = dpcheck("drift", "run4", "lr4", cwd=tmp)
        expect(d.returncode == 1, "drift against the planted learning rate did not exit 1")
        for words in ("bug: step 0 of B: the job failed dpcheck.torch's check: replicas differ after step 0",
                      "A also recorded 3 steps that B did not"):
            expect(words in d.stdout, f"drift against the planted learning rate lacks: {words}")
        rep = dpcheck("replay", "lr4", "--step", "0", cwd=tmp)
        expect(rep.returncode == 1 and "first difference: hyperparameters param_groups[0][\"lr\"]" in rep.stdout,
               "replay of the planted learning rate's step does not name lr")

        # Recorded steps changed after the fact: a wrong update, parameters changed between steps.
        shutil.copytree(os.path.join(tmp, "run2"), os.path.join(tmp, "upd2"))
        after = os.path.join(tmp, "upd2", "step-00000001", "params_after.npy")
        a = np.load(after)
        a[7] += np.float32(1e-3)
        np.save(after, a)
        rep = dpcheck("replay", "upd2", "--step", "1", cwd=tmp)
        expect(rep.returncode == 1 and "first phase out of the bound: optimizer at 0.weight[0, 7]" in rep.stdout,
               "a changed update is not located to the optimizer at 0.weight[0, 7]")
        d = dpcheck("drift", "run4", "upd2", cwd=tmp)
        expect(d.returncode == 1 and "bug: step 1 of B: optimizer at 0.weight[0, 7]" in d.stdout,
               "drift does not name the changed update")
        shutil.copytree(os.path.join(tmp, "run2"), os.path.join(tmp, "mid2"))
        before = os.path.join(tmp, "mid2", "step-00000002", "params.npy")
        b = np.load(before)
        b[-1] = np.nextafter(b[-1], np.float32(np.inf))
        np.save(before, b)
        d = dpcheck("drift", "run2", "mid2", cwd=tmp)
        expect(d.returncode == 1 and "bug in B, outside the optimizer's step: the parameters changed between the end of "
               "step 1 and the start of step 2 at 4.bias[3]" in d.stdout,
               "drift does not name parameters changed between two steps")

        # A record that exists is refused and left as it was.
        listing = sorted(os.listdir(os.path.join(tmp, "run2")))
        r = job(2, JOB, "--steps", "1", "--record", "run2", cwd=tmp)
        expect(r.returncode != 0 and "record run2: it exists" in r.stdout, "an existing record was not refused")
        expect(sorted(os.listdir(os.path.join(tmp, "run2"))) == listing, "an existing record was changed")
    print("; ".join(problems) if problems else "records: as expected")
    print("1 passed, 0 failed" if not problems else "0 passed, 1 failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
