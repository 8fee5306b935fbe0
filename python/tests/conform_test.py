"""dpcheck.conform on real process groups: conform's checks judge PyTorch's ProcessGroupGloo, and a planted
broken all-reduce is caught.

    conform_test.py gloo       on 2 ranks: an exact float32 sum and the same bits on every rank pass, the
                               reports read as dpcheck conform's do, and what Gloo refuses (ReduceOp.AVG,
                               bfloat16) is "unsupported" with Gloo's own error, not a failure
    conform_test.py planted    on 3 ranks, a group whose all-reduce sums the gathered inputs starting from
                               each rank's own (so the ranks round differently): "same bits on every rank
                               float32 sum" fails, naming the ranks and the ulps, with a replay line, while
                               the exact sums, whose inputs add exactly in any order, still pass
    conform_test.py bad-input  each bad option is refused with one line and exit status 2, before any rank
                               starts

Exits 0 when every expectation holds; prints what differed otherwise.
"""

import json
import os
import subprocess
import sys
import tempfile

PYTHON = sys.executable
HERE = os.path.abspath(__file__)


def launch(n, argv, report=None, script=None):
    """python3 -m dpcheck.launch -n N -m dpcheck.conform ARGV (or this file as the ranks' script): (status,
    output, report or None)."""
    target = [script] if script else ["-m", "dpcheck.conform"]
    cmd = [PYTHON, "-m", "dpcheck.launch", "-n", str(n), "--timeout", "240"] + target + argv
    if report:
        cmd += ["--report", report]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    j = None
    if report and os.path.exists(report):
        with open(report) as f:
            j = json.load(f)
    return done.returncode, out, j


class Failures:
    def __init__(self):
        self.lines = []

    def expect(self, cond, what, output=""):
        if not cond:
            self.lines.append(what + ("\n--- output ---\n" + output if output else ""))

    def end(self):
        for line in self.lines:
            print("FAILED: " + line)
        print("%s" % ("every expectation held" if not self.lines else "%d expectations failed" % len(self.lines)))
        return 1 if self.lines else 0


def row(report, check):
    for c in report["checks"]:
        if c["check"] == check:
            return c
    return None


def gloo(tmp):
    f = Failures()
    report = os.path.join(tmp, "r.json")
    status, out, j = launch(2, ["--max-mib", "1", "--check", "same bits on every rank float32 sum"], report)
    f.expect(status == 0 and j is not None, "same bits float32 sum on 2 ranks: exit %d, report %s" % (status, j), out)
    if j:
        c = row(j, "same bits on every rank float32 sum")
        f.expect(j["passed"] and c and c["verdict"] == "pass", "same bits float32 sum passes: %s" % c, out)
        f.expect(j["world_size"] == 2 and "ProcessGroupGloo" in j["plugin"]["name"], "the report names the group", out)
        f.expect("float32" in j["plugin"]["dtypes"] and "bfloat16" not in j["plugin"]["dtypes"],
                 "the report's dtypes are what Gloo takes: %s" % j["plugin"]["dtypes"], out)
        f.expect("same bits on every rank float32 sum" in out and "the plugin kept every promise checked" in out,
                 "rank 0 prints the table and the verdict", out)
    os.remove(report) if os.path.exists(report) else None
    status, out, j = launch(2, ["--max-mib", "1", "--check", "allreduce float32 sum"], report)
    f.expect(status == 0 and j and row(j, "allreduce float32 sum")["verdict"] == "pass",
             "allreduce float32 sum passes on 2 ranks (exit %d)" % status, out)
    for check, said in (("allreduce float32 avg", "Cannot use ReduceOp.AVG with Gloo"),
                        ("allreduce bfloat16 sum", "Invalid scalar type")):
        os.remove(report) if os.path.exists(report) else None
        status, out, j = launch(2, ["--check", check], report)
        c = row(j, check) if j else None
        f.expect(status == 0 and c and c["verdict"] == "unsupported" and said in c["detail"],
                 "%s is unsupported with Gloo's words '%s': exit %d, row %s" % (check, said, status, c), out)
    return f.end()


def planted_rank():
    """One rank of the planted group: dpcheck.conform with an all-reduce that sums in a rank-dependent order."""
    import torch
    import torch.distributed as dist

    from dpcheck import conform

    class RankOrderSum(conform.ProcessGroupComm):
        # The float sums gather every rank's input and add them starting from this rank's own: a sum of
        # three or more inputs rounds differently on each rank. Everything else is Gloo's.
        def all_reduce(self, buf, dtype, op):
            t = self.tensor(buf, dtype)
            if op != "sum" or dtype not in ("float32", "float64") or t.numel() == 0:
                return super().all_reduce(buf, dtype, op)
            parts = [torch.empty_like(t) for _ in range(self.size)]
            dist.all_gather(parts, t.clone())
            me = dist.get_rank()
            total = parts[me].clone()
            for k in range(1, self.size):
                total += parts[(me + k) % self.size]
            t.copy_(total)

    return conform.main(sys.argv[1:], comm_class=RankOrderSum)


def planted(tmp):
    f = Failures()
    report = os.path.join(tmp, "r.json")
    status, out, j = launch(3, ["--max-mib", "1", "--check", "same bits on every rank float32 sum"], report,
                            script=HERE)
    c = row(j, "same bits on every rank float32 sum") if j else None
    f.expect(status == 1 and j and not j["passed"] and c and c["verdict"] == "fail",
             "the planted rank order fails 'same bits on every rank float32 sum': exit %d, row %s" % (status, c), out)
    if c and c["verdict"] == "fail":
        f.expect("result differs from rank 0's" in c["detail"] and "ulp" in c["detail"],
                 "the failure names the ranks and the ulps: %s" % c["detail"], out)
        f.expect(c["replay"].startswith("python3 -m dpcheck.launch -n 3 -m dpcheck.conform --max-mib 1 --check "
                                        "'same bits on every rank float32 sum' --case 'count="),
                 "the replay line runs the minimal case: %s" % c["replay"], out)
        f.expect("FAILED same bits on every rank float32 sum" in out, "rank 0 prints the failure", out)
    os.remove(report) if os.path.exists(report) else None
    status, out, j = launch(3, ["--max-mib", "1", "--check", "allreduce float32 sum"], report, script=HERE)
    c = row(j, "allreduce float32 sum") if j else None
    f.expect(status == 0 and c and c["verdict"] == "pass",
             "the planted group's exact sums still pass (only the ranks' bits tell): exit %d, row %s" % (status, c),
             out)
    return f.end()


BAD = [
    (["--check", "allreduce float128 sum"], "--check 'allreduce float128 sum' is not a check of a communicator"),
    (["--case", "count=5 offset=1"], "--case needs --check"),
    (["--check", "allreduce float32 sum", "--case", "count=x"], "count=x"),
    (["--check", "schedule float32 sum"], "needs --schedule NAME"),
    (["--schedule", "butterfly"], "butterfly"),
    (["--check", "property replicas_bitwise_synchronized"], "verify's properties do not run on a process group"),
    (["--max-mib", "-1"], "--max-mib -1: must be in [0, 4096]"),
    (["--seed", "-3"], "--seed -3"),
    (["--timeout", "0"], "--timeout 0"),
    (["--backend", "nccl"], "--backend nccl"),
    (["--report", "/proc/dpcheck.json"], "--report"),
    (["--no-such-option"], "unrecognized arguments: --no-such-option"),
    ([], "not started by a launcher"),
]


def bad_input(tmp):
    f = Failures()
    # Outside a launcher, as a user would first try it; --report's refusal is rank 0's, after the launcher's.
    ranked = dict(os.environ, RANK="0", WORLD_SIZE="2")
    unranked = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    for argv, said in BAD:
        env = ranked if "--report" in argv else unranked
        done = subprocess.run([PYTHON, "-m", "dpcheck.conform"] + argv, capture_output=True, text=True, env=env,
                              timeout=60)
        lines = done.stderr.strip().splitlines()
        f.expect(done.returncode == 2 and len(lines) == 1 and lines[0].startswith("python3 -m dpcheck.conform: error: ")
                 and said in lines[0] and not done.stdout,
                 "%s: exit %d, stderr %r, stdout %r (wanted one line with %r)" % (
                     " ".join(argv), done.returncode, done.stderr, done.stdout, said))
    help_run = subprocess.run([PYTHON, "-m", "dpcheck.conform", "--help"], capture_output=True, text=True, timeout=60)
    f.expect(help_run.returncode == 0 and "--schedule" in help_run.stdout and "dpcheck.launch" in help_run.stdout,
             "--help prints the options", help_run.stdout + help_run.stderr)
    return f.end()


def main():
    if len(sys.argv) >= 2 and sys.argv[1] not in ("gloo", "planted", "bad-input"):
        return planted_rank()  # a rank of the planted group, as launch() starts this file
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix="dpcheck-conform-test-") as tmp:
        return {"gloo": gloo, "planted": planted, "bad-input": bad_input}[sys.argv[1]](tmp)


if __name__ == "__main__":
    sys.exit(main())
