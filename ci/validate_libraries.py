#!/usr/bin/env python3
"""What dpcheck says about real libraries: the table in docs/libraries.md, generated, never typed.

Every row is one library x algorithm x world size, run through `dpcheck conform` as a user would: the
Gloo adapter under each of its all-reduce algorithms (ranks as threads), Open MPI's own all-reduce under
each of its tuned algorithms (`--comm mpi-native` under mpirun, the algorithm forced through MCA
parameters), and the BLAS and oneDNN kernel plugins. NCCL joins where a GPU is (one rank per GPU).
Each row gives the verdict, the first broken promise with its distance (ulps, error ratio) and the
command that replays it.

  ci/validate-libraries.sh                 the whole table (about half an hour on two cores), written to
                                           docs/libraries.md
  ci/validate-libraries.sh --check         the CI subset (N = 2 and 3, small cases, and the --schedule
                                           rows; a few minutes): exit 1 when a verdict differs from the
                                           committed table's subset
  --jobs N                                 rows run N at a time (default: one per CPU); a row's time is
                                           its own run's, so on a busy machine it reads longer
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GLOO_ALGORITHMS = ["ring", "ring_chunked", "halving_doubling", "bcube", "allreduce_ring", "allreduce_bcube"]
# Open MPI's coll_tuned_allreduce_algorithm values (ompi_info --param coll tuned --level 9).
MPI_ALGORITHMS = [(1, "basic_linear"), (2, "nonoverlapping"), (3, "recursive_doubling"), (4, "ring"),
                  (5, "segmented_ring"), (6, "rabenseifner")]
KERNEL_PLUGINS = [("OpenBLAS", "examples/kernels_blas/libdpcheck_kernels_openblas.so", "libopenblas-dev"),
                  ("BLIS", "examples/kernels_blas/libdpcheck_kernels_blis.so", "libblis-dev"),
                  ("oneDNN", "examples/kernels_onednn/libdpcheck_kernels_onednn.so", "libdnnl-dev")]
# Schedules checked bit for bit (`conform --schedule`), in the table and the CI subset alike: an
# algorithm, the world at which its schedule shows, and the schedule its fingerprint named there
# ("Which schedule each algorithm follows" in docs/libraries.md).
GLOO_SCHEDULES = [("halving_doubling", 8, "halving-doubling")]
MPI_SCHEDULES = [(4, "ring", 4, "ring"), (3, "recursive_doubling", 8, "halving-doubling"),
                 (6, "rabenseifner", 8, "halving-doubling")]
SCHEDULE_FLAGS = ["--no-properties", "--check", "schedule float32 sum"]
FULL_WORLDS = [2, 3, 4]
QUICK_WORLDS = [2, 3]
# The CI subset: conform's own checks on small buffers and shapes, no properties of verify.
QUICK_COMM_FLAGS = ["--no-properties", "--max-mib", "1"]
QUICK_KERNEL_FLAGS = ["--no-properties", "--max-size", "128"]
TIMEOUT_S = 900


class Row:
    def __init__(self, library, algorithm, world, argv, env=None, replay_prefix="", kind="comm"):
        self.library, self.algorithm, self.world = library, algorithm, world
        self.argv, self.env, self.replay_prefix, self.kind = argv, env or {}, replay_prefix, kind
        self.verdict = self.check = self.promise = self.distance = self.replay = self.detail = ""
        self.unsupported = 0
        self.seconds = 0.0

    def key(self):
        return (self.library, self.algorithm, str(self.world))


def package_version(package):
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""
    except OSError:
        return ""


def mpirun():
    for name in ("mpirun", "mpiexec"):
        path = shutil.which(name)
        if path:
            return path
    return ""


def has_gpu():
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def rows_for(build, quick, only):
    dpcheck = os.path.join(build, "dpcheck")
    worlds = QUICK_WORLDS if quick else FULL_WORLDS
    flags = QUICK_COMM_FLAGS if quick else []
    kernel_flags = QUICK_KERNEL_FLAGS if quick else []
    rows = []
    gloo = os.path.join(build, "examples/comm_gloo/libdpcheck_comm_gloo.so")
    for algorithm in GLOO_ALGORITHMS:
        for n in worlds:
            rows.append(Row("Gloo", algorithm, n,
                            [dpcheck, "conform", "--comm", gloo, "--world-size", str(n)] + flags,
                            env={"DPCHECK_GLOO_ALGORITHM": algorithm},
                            replay_prefix="DPCHECK_GLOO_ALGORITHM=" + algorithm + " "))
    # The same adapter declaring float16, whose Gloo type loses some results (examples/comm_gloo/README.md).
    gloo16 = os.path.join(build, "examples/comm_gloo/libdpcheck_comm_gloo_float16.so")
    for n in worlds:
        rows.append(Row("Gloo, float16 declared", "allreduce_ring", n,
                        [dpcheck, "conform", "--comm", gloo16, "--world-size", str(n)] + flags,
                        env={"DPCHECK_GLOO_ALGORITHM": "allreduce_ring"},
                        replay_prefix="DPCHECK_GLOO_ALGORITHM=allreduce_ring "))
    launcher = mpirun()
    for number, algorithm in MPI_ALGORITHMS:
        for n in worlds:
            mca = ["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", str(number)]
            rows.append(Row("Open MPI", algorithm, n,
                            [launcher, "--allow-run-as-root", "--oversubscribe", "-np", str(n)] + mca +
                            [dpcheck, "conform", "--comm", "mpi-native"] + flags,
                            # Open MPI's all-reduce spared the slow first touch of fresh memory (BUILD-NOTES).
                            env={"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "68719476736"},
                            replay_prefix=""))
    for algorithm, n, schedule in GLOO_SCHEDULES:
        rows.append(Row("Gloo", "%s, --schedule %s" % (algorithm, schedule), n,
                        [dpcheck, "conform", "--comm", gloo, "--world-size", str(n), "--schedule", schedule] +
                        SCHEDULE_FLAGS,
                        env={"DPCHECK_GLOO_ALGORITHM": algorithm},
                        replay_prefix="DPCHECK_GLOO_ALGORITHM=" + algorithm + " "))
    for number, algorithm, n, schedule in MPI_SCHEDULES:
        mca = ["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", str(number)]
        rows.append(Row("Open MPI", "%s, --schedule %s" % (algorithm, schedule), n,
                        [launcher, "--allow-run-as-root", "--oversubscribe", "-np", str(n)] + mca +
                        [dpcheck, "conform", "--comm", "mpi-native", "--schedule", schedule] + SCHEDULE_FLAGS,
                        env={"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "68719476736"},
                        replay_prefix=""))
    for library, path, _ in KERNEL_PLUGINS:
        for n in worlds:
            rows.append(Row(library, "sgemm" if library != "oneDNN" else "matmul", n,
                            [dpcheck, "conform", "--kernels", os.path.join(build, path), "--world-size", str(n)] +
                            kernel_flags,
                            kind="kernels"))
    if has_gpu():
        nccl = os.path.join(build, "examples/comm_nccl/libdpcheck_comm_nccl.so")
        rows.append(Row("NCCL", "default", 1, [dpcheck, "conform", "--engine", "cuda", "--comm", nccl,
                                                  "--world-size", "1"] + flags))
    if only:
        rows = [r for r in rows if re.search(only, " ".join(r.key()))]
    return rows


DISTANCE = [re.compile(r"\(\d+ ulps? apart\)"), re.compile(r"largest distance from the majority value: \d+ ulps?"),
            re.compile(r"error ratio [0-9.e+-]+|error ratio inf"), re.compile(r"\(off by -?\d+\)")]


def distance_of(text):
    for pattern in DISTANCE:
        m = pattern.search(text)
        if m:
            return m.group(0).strip("()")
    return ""


def one_line(text, most=160):
    text = " ".join(text.split())
    return text if len(text) <= most else text[: most - 3] + "..."


def run(row, build):
    with tempfile.TemporaryDirectory(prefix="dpcheck-libraries-") as scratch:
        report = os.path.join(scratch, "r.json")
        env = dict(os.environ)
        env.update(row.env)
        env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
        argv = list(row.argv) + ["--quiet", "--report", report]
        start = time.monotonic()
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=scratch)
            status, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            status, output = -1, "timed out after %d s" % TIMEOUT_S
        row.seconds = time.monotonic() - start
        if not os.path.exists(report):
            lines = [l for l in output.splitlines() if l.strip()]
            row.verdict = "error"
            row.detail = one_line(lines[-1] if lines else "exit %d, no report" % status)
            return
        with open(report) as f:
            j = json.load(f)
    checks = j["checks"]
    row.unsupported = sum(1 for c in checks if c["verdict"] == "unsupported")
    failed = [c for c in checks if c["verdict"] == "fail"]
    row.verdict = "pass" if j["passed"] else "FAIL"
    if failed:
        first = failed[0]
        row.check = first["check"]
        row.promise = first["promise"] or ""
        row.detail = one_line(first["detail"] or "")
        row.distance = distance_of(first["detail"] or "")
        replay = first["replay"] or ""
        row.replay = row.replay_prefix + replay
        row.failed_checks = [c["check"] for c in failed]
    else:
        row.failed_checks = []


def relative(text, build):
    return text.replace(os.path.join(ROOT, ""), "").replace(build + "/", "build/")


def table(rows, build):
    out = ["| library | algorithm | N | verdict | first broken promise | distance | replay |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r.verdict == "FAIL":
            broken = "`%s`: %s" % (r.check, one_line(r.detail, 150))
            if len(r.failed_checks) > 1:
                broken += " (and %d more rows)" % (len(r.failed_checks) - 1)
        elif r.verdict == "error":
            broken = r.detail
        else:
            broken = ""
        verdict = r.verdict + (" (%d unsupported)" % r.unsupported if r.unsupported else "")
        replay = "`%s`" % relative(r.replay, build) if r.replay else ""
        out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            r.library, r.algorithm, r.world, verdict, broken.replace("|", "\\|"), r.distance, replay.replace("|", "\\|")))
    return "\n".join(out)


def versions():
    ompi = ""
    try:
        ompi = subprocess.run(["ompi_info", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        pass
    lines = ["| library | Debian package | version |", "| --- | --- | --- |",
             "| Gloo | libgloo-dev | %s |" % package_version("libgloo-dev"),
             "| Open MPI | libopenmpi-dev | %s (%s) |" % (package_version("libopenmpi-dev"), ompi)]
    for library, _, package in KERNEL_PLUGINS:
        lines.append("| %s | %s | %s |" % (library, package, package_version(package)))
    return "\n".join(lines)


# The measured section on which schedule each algorithm follows (fingerprints at N = 3, 4 and 8, run by
# hand as it says): kept from the table being replaced, between these markers.
BEGIN_SCHEDULES = "<!-- schedules: begin -->"
END_SCHEDULES = "<!-- schedules: end -->"
BEGIN_QUICK = "<!-- ci subset: begin -->"
END_QUICK = "<!-- ci subset: end -->"


def parse_subset(path):
    """The committed CI subset: {(library, algorithm, N): (verdict, first failing check)}."""
    text = open(path).read()
    if BEGIN_QUICK not in text:
        sys.exit("%s has no CI subset between %s and %s" % (path, BEGIN_QUICK, END_QUICK))
    block = text.split(BEGIN_QUICK, 1)[1].split(END_QUICK, 1)[0]
    out = {}
    for line in block.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) < 5 or cells[0] in ("library", "---"):
            continue
        check = re.match(r"`([^`]*)`", cells[4])
        out[(cells[0], cells[1], cells[2])] = (cells[3].split(" ")[0], check.group(1) if check else "")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build folder (default build/)")
    parser.add_argument("--check", action="store_true",
                        help="run the CI subset and compare it with the committed table (exit 1 on a change)")
    parser.add_argument("--output", default=os.path.join(ROOT, "docs/libraries.md"),
                        help="the table to write, or with --check to compare with (default docs/libraries.md)")
    parser.add_argument("--only", default="", help="rows whose 'library algorithm N' matches this regex")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="rows run at once (default: the number of CPUs); each row's time is its own run's")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error("--jobs %d: not a positive number" % args.jobs)
    build = os.path.abspath(args.build)
    if not os.path.exists(os.path.join(build, "dpcheck")):
        sys.exit("%s: no dpcheck here; build first (bash ci/build.sh)" % build)

    def go(rows, label):
        # Rows run args.jobs at a time and are printed in table order as they end.
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            ended = [pool.submit(run, r, build) for r in rows]
            for i, (r, end) in enumerate(zip(rows, ended), 1):
                end.result()
                print("[%s %d/%d] %-9s %-18s N=%s  %-5s %6.1f s  %s" % (
                    label, i, len(rows), r.library, r.algorithm, r.world, r.verdict, r.seconds,
                    r.check or r.detail[:60]), flush=True)
        return rows

    if args.check:
        committed = parse_subset(args.output)
        rows = go(rows_for(build, True, args.only), "subset")
        changed = []
        for r in rows:
            want = committed.get(r.key())
            got = (r.verdict, r.check)
            if want is None:
                changed.append("%s: not in the committed subset (now %s %s)" % (" ".join(r.key()), *got))
            elif want != got:
                changed.append("%s: %s %s in %s, now %s %s" % (" ".join(r.key()), want[0], want[1], args.output, *got))
        for line in changed:
            print("CHANGED " + line)
        print("ci/validate-libraries.sh --check: %d rows, %s" % (
            len(rows), "%d changed" % len(changed) if changed else "every verdict as committed"))
        return 1 if changed else 0

    schedules = ""
    if os.path.exists(args.output) and BEGIN_SCHEDULES in open(args.output).read():
        kept = open(args.output).read().split(BEGIN_SCHEDULES, 1)[1].split(END_SCHEDULES, 1)[0]
        schedules = BEGIN_SCHEDULES + kept + END_SCHEDULES + "\n\n"
    full = go(rows_for(build, False, args.only), "full")
    quick = go(rows_for(build, True, args.only), "subset")
    text = """# What dpcheck says about real libraries

Generated by `ci/validate-libraries.sh` (do not edit by hand); each row is `dpcheck conform` run as a user
runs it, on the machine and library versions below. CI runs the subset at the end (N = 2 and 3, small
buffers, no properties, and the `--schedule` rows: `ci/validate-libraries.sh --check`) and fails when a
verdict changes.

- **Gloo**: `examples/comm_gloo` under `DPCHECK_GLOO_ALGORITHM=<algorithm>`, ranks as threads over TCP on
  127.0.0.1; "float16 declared" is the same adapter built to declare float16 too
  (`libdpcheck_comm_gloo_float16.so`).
- **Open MPI**: `mpirun -np N --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm <k>
  dpcheck conform --comm mpi-native`: MPI's own `MPI_Allreduce` under each tuned algorithm.
- **OpenBLAS, BLIS, oneDNN**: `examples/kernels_blas` and `examples/kernels_onednn` as kernel plugins of the
  CPU engine (linear forward and backward); N is the world of verify's properties with them.
- **NCCL** (`examples/comm_nccl`) joins the table where a GPU is.

A verdict of `FAIL` is the library's: the evidence that it is the library and not the adapter is in the
adapters' READMEs (`examples/comm_gloo/README.md`). `unsupported` counts the checks of a dtype or op the
plugin does not declare. Gloo's bcube at N = 4 races (its run waits for the peers of its first step
only), so which of its checks fails first changes from run to run; the CI subset holds no such row.

## Versions

%s

## The table

%s

%s## The CI subset

%s
%s
%s
""" % (versions(), table(full, build), schedules, BEGIN_QUICK, table(quick, build), END_QUICK)
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    tmp = args.output + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, args.output)
    print("wrote " + args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
