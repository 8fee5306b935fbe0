#!/usr/bin/env python3
"""What dpcheck says about real libraries: the table in docs/libraries.md, generated, never typed.

Every row is one library x algorithm x world size, run through `dpcheck conform` as a user would: the
Gloo adapter under each of its all-reduce algorithms (ranks as threads), Open MPI's own all-reduce under
each of its tuned algorithms (`--comm mpi-native` under mpirun, the algorithm forced through MCA
parameters), MPICH's under each of its algorithms (dpcheck-mpich under mpiexec.mpich, the algorithm forced
through its control variables), and the BLAS and oneDNN kernel plugins. NCCL joins where a GPU is (one
rank per GPU, each algorithm and protocol).
Each row gives the verdict, the first broken promise with its distance (ulps, error ratio) and the
command that replays it.

  ci/validate-libraries.sh                 the whole table (about half an hour on two cores), written to
                                           docs/libraries.md
  ci/validate-libraries.sh --check         the CI subset (N = 2 and 3, small cases, and the --schedule
                                           rows; a few minutes): exit 1 when a verdict differs from the
                                           committed table's subset
  --jobs N                                 rows under an MPI launcher run N at a time (default: one per
                                           CPU), the others 2N; a row's time is its own run's, so on a
                                           busy machine it reads longer
  --merge --only REGEX [--part full|subset] only the rows REGEX picks, every other row kept as it was in
                                           the table (MPICH's rows at N = 2..9 take hours on two cores:
                                           they can be run a part at a time)
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
# Open MPI's ring and Rabenseifner hand small calls to other algorithms: claimed as the plain schedule
# their rows say "switches" and where; the library schedules that model the switch are exact throughout.
MPI_SCHEDULES = [(4, "ring", 4, "ring"), (4, "ring", 4, "open-mpi-ring"), (3, "recursive_doubling", 8, "halving-doubling"),
                 (6, "rabenseifner", 8, "halving-doubling"), (6, "rabenseifner", 8, "open-mpi-rabenseifner"),
                 (1, "basic_linear", 5, "linear")]
# MPICH 4.0.2's all-reduce algorithms (src/mpi/coll/cvars.txt): the blocking ones of
# MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM, and through its "nb" the non-blocking ones of
# MPIR_CVAR_IALLREDUCE_INTRA_ALGORITHM, those with a k at 2, 3 and 4. MPIR_CVAR_DEVICE_COLLECTIVES=none keeps
# the device's own selection out of the way, so that the variable is obeyed on any build.
MPICH_BLOCKING = ["recursive_doubling", "reduce_scatter_allgather", "smp"]
MPICH_NONBLOCKING = ["sched_naive", "sched_smp", "sched_recursive_doubling", "sched_reduce_scatter_allgather", "tsp_ring"]
MPICH_WITH_K = [("tsp_recexch_single_buffer", "RECEXCH"), ("tsp_recexch_multiple_buffer", "RECEXCH"),
                ("tsp_recexch_reduce_scatter_recexch_allgatherv", "RECEXCH"), ("tsp_tree", "TREE")]
MPICH_WORLDS = list(range(2, 10))
# The CI subset's MPICH rows: N = 3 for a blocking algorithm, and a non-blocking one, recursive exchange
# with k = 3, whose ranks disagree (the table's notes give MPICH's own word on it).
MPICH_QUICK = [("recursive_doubling", 3), ("nb tsp_recexch_single_buffer k=3", 3)]
MPICH_SCHEDULES = [("recursive_doubling", 5, "halving-doubling"), ("reduce_scatter_allgather", 8, "halving-doubling"),
                   ("nb tsp_recexch_single_buffer k=2", 8, "halving-doubling")]
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

    def polls(self):
        """Whether the row's ranks are MPI processes, which poll for messages rather than wait."""
        return os.path.basename(self.argv[0]).startswith(("mpirun", "mpiexec", "orterun"))

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


def mpich_variants():
    """Each MPICH algorithm as (its name in the table, the variables that choose it)."""
    out = []
    for a in MPICH_BLOCKING:
        out.append((a, {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": a}))
    nb = {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "nb"}
    for a in MPICH_NONBLOCKING:
        out.append(("nb " + a, dict(nb, MPIR_CVAR_IALLREDUCE_INTRA_ALGORITHM=a)))
    for a, family in MPICH_WITH_K:
        for k in (2, 3, 4):
            out.append(("nb %s k=%d" % (a, k),
                        dict(nb, MPIR_CVAR_IALLREDUCE_INTRA_ALGORITHM=a, **{"MPIR_CVAR_IALLREDUCE_%s_KVAL" % family: str(k)})))
    return out


def mca_env(number):
    """Open MPI's tuned all-reduce forced to algorithm `number`, as environment variables (which mpirun
    hands to every rank; conform puts the set ones in front of its replay lines)."""
    return {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1", "OMPI_MCA_coll_tuned_allreduce_algorithm": str(number)}


def gpu_count():
    """The GPUs nvidia-smi lists; 0 where it is missing or fails."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    out = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return len([l for l in out.stdout.splitlines() if l.startswith("GPU ")]) if out.returncode == 0 else 0


# NCCL's algorithm and protocol, each row forced through its variables (NCCL's environment documentation):
# NCCL_ALGO=Ring|Tree, NCCL_PROTO=LL|LL128|Simple; the schedule each algorithm claims where N >= 2.
NCCL_ALGOS = [("Ring", "ring"), ("Tree", "tree")]
NCCL_PROTOS = ["LL", "LL128", "Simple"]


def torch_rows(build, quick):
    """PyTorch's ProcessGroupGloo (Debian's python3-torch, its own Gloo) through dpcheck.conform: conform's
    communicator checks on torch.distributed's all_reduce, broadcast, all_gather and barrier, one process
    per rank under dpcheck.launch. None where dpcheck.conform is not built or PyTorch is not installed."""
    if not os.path.exists(os.path.join(build, "python/dpcheck/conform-host")) or not package_version("python3-torch"):
        return []
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    env = {"PYTHONPATH": os.path.join(build, "python")}
    rows = []

    def conform(n, argv):
        return [python, "-m", "dpcheck.launch", "-n", str(n), "--no-prefix", "-m", "dpcheck.conform"] + argv

    for n in QUICK_WORLDS if quick else FULL_WORLDS:
        rows.append(Row("PyTorch ProcessGroupGloo", "all_reduce", n, conform(n, ["--max-mib", "1"] if quick else []),
                        env=env, replay_prefix="PYTHONPATH=build/python "))
    # No --schedule row: its bits on random inputs are no schedule's dpcheck emulates (its fingerprint in
    # docs/libraries.md), and PyTorch promises none, so a claimed one would fail dpcheck's guess, not it.
    return rows


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
                            env={"DPCHECK_GLOO_ALGORITHM": algorithm}))
    # The same adapter declaring float16, whose Gloo type loses some results (examples/comm_gloo/README.md).
    gloo16 = os.path.join(build, "examples/comm_gloo/libdpcheck_comm_gloo_float16.so")
    for n in worlds:
        rows.append(Row("Gloo, float16 declared", "allreduce_ring", n,
                        [dpcheck, "conform", "--comm", gloo16, "--world-size", str(n)] + flags,
                        env={"DPCHECK_GLOO_ALGORITHM": "allreduce_ring"}))
    launcher = mpirun()
    # Open MPI's all-reduce spared the slow first touch of fresh memory (as tests/mpi_verify_test.cpp does).
    malloc = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "68719476736"}
    for number, algorithm in MPI_ALGORITHMS:
        for n in worlds:
            rows.append(Row("Open MPI", algorithm, n,
                            [launcher, "--allow-run-as-root", "--oversubscribe", "-np", str(n)] +
                            [dpcheck, "conform", "--comm", "mpi-native"] + flags,
                            env=dict(malloc, **mca_env(number))))
    mpich = os.path.join(build, "dpcheck-mpich")
    if os.path.exists(mpich):
        quick_mpich = dict(MPICH_QUICK)
        for algorithm, env in mpich_variants():
            env = dict({"MPIR_CVAR_DEVICE_COLLECTIVES": "none"}, **env)
            for n in MPICH_WORLDS:
                if quick and quick_mpich.get(algorithm) != n:
                    continue
                rows.append(Row("MPICH", algorithm, n,
                                ["mpiexec.mpich", "-n", str(n), mpich, "conform", "--comm", "mpi-native",
                                 "--allreduce-only"] + QUICK_COMM_FLAGS,
                                env=env))
    for algorithm, n, schedule in GLOO_SCHEDULES:
        rows.append(Row("Gloo", "%s, --schedule %s" % (algorithm, schedule), n,
                        [dpcheck, "conform", "--comm", gloo, "--world-size", str(n), "--schedule", schedule] +
                        SCHEDULE_FLAGS,
                        env={"DPCHECK_GLOO_ALGORITHM": algorithm}))
    for number, algorithm, n, schedule in MPI_SCHEDULES:
        rows.append(Row("Open MPI", "%s, --schedule %s" % (algorithm, schedule), n,
                        [launcher, "--allow-run-as-root", "--oversubscribe", "-np", str(n)] +
                        [dpcheck, "conform", "--comm", "mpi-native", "--schedule", schedule] + SCHEDULE_FLAGS,
                        env=dict(malloc, **mca_env(number))))
    if os.path.exists(mpich):
        chosen = dict(mpich_variants())
        for algorithm, n, schedule in MPICH_SCHEDULES:
            env = dict({"MPIR_CVAR_DEVICE_COLLECTIVES": "none"}, **chosen[algorithm])
            rows.append(Row("MPICH", "%s, --schedule %s" % (algorithm, schedule), n,
                            ["mpiexec.mpich", "-n", str(n), mpich, "conform", "--comm", "mpi-native", "--schedule",
                             schedule] + SCHEDULE_FLAGS,
                            env=env))
    for library, path, _ in KERNEL_PLUGINS:
        for n in worlds:
            rows.append(Row(library, "sgemm" if library != "oneDNN" else "matmul", n,
                            [dpcheck, "conform", "--kernels", os.path.join(build, path), "--world-size", str(n)] +
                            kernel_flags,
                            kind="kernels"))
    rows += torch_rows(build, quick)
    gpus = gpu_count()
    if gpus:
        nccl = os.path.join(build, "examples/comm_nccl/libdpcheck_comm_nccl.so")
        base = [dpcheck, "conform", "--engine", "cuda", "--comm", nccl, "--world-size", str(gpus)]
        rows.append(Row("NCCL", "default", gpus, base + flags))
        for algo, schedule in NCCL_ALGOS:
            for proto in NCCL_PROTOS:
                env = {"NCCL_ALGO": algo, "NCCL_PROTO": proto}
                rows.append(Row("NCCL", "%s/%s" % (algo, proto), gpus, base + flags, env=env))
                if gpus >= 2:
                    rows.append(Row("NCCL", "%s/%s, --schedule %s" % (algo, proto, schedule), gpus,
                                    base + ["--schedule", schedule] + SCHEDULE_FLAGS, env=env))
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
    switched = [c for c in checks if c["verdict"] == "switches"]
    if switched and not failed:
        # The schedule claimed holds at some counts, and the library hands the others to another schedule.
        row.verdict = "switches"
        row.check = switched[0]["check"]
        row.detail = one_line(switched[0]["detail"] or "", 400)
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


TABLE_HEAD = ["| library | algorithm | N | verdict | first broken promise | distance | replay |",
              "| --- | --- | --- | --- | --- | --- | --- |"]


def table_rows(text):
    """A table's rows as {(library, algorithm, N): the line}, the head left out."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) >= 7 and cells[0] not in ("library", "---"):
            out[(cells[0], cells[1], cells[2])] = line
    return out


def merged(order, lines, kept):
    """The table of the rows `order` lists: each one's new line where it ran now, else the kept one; a row
    neither ran nor kept is left out (run it with --merge --only). Kept rows this machine cannot run (NCCL's
    where there is no GPU, MPICH's without dpcheck-mpich) stay, after the others."""
    out = list(TABLE_HEAD)
    for key in order:
        if key in lines:
            out.append(lines[key])
        elif key in kept:
            out.append(kept[key])
    known = set(order)
    out += [line for key, line in kept.items() if key not in known]
    return "\n".join(out)


def table(rows, build):
    out = list(TABLE_HEAD)
    for r in rows:
        if r.verdict == "switches":
            broken = "`%s`: %s" % (r.check, r.detail)
        elif r.verdict == "FAIL":
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
             "| Open MPI | libopenmpi-dev | %s (%s) |" % (package_version("libopenmpi-dev"), ompi),
             "| MPICH | libmpich-dev | %s |" % package_version("libmpich-dev"),
             "| PyTorch (ProcessGroupGloo) | python3-torch | %s |" % package_version("python3-torch")]
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
    parser.add_argument("--merge", action="store_true",
                        help="run only the rows --only picks and keep every other row of the table being replaced "
                             "as it was (a part of the table regenerated; the rows' order stays the table's)")
    parser.add_argument("--part", choices=["both", "full", "subset"], default="both",
                        help="with --merge: the table's rows, the CI subset's, or both (default)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="rows under an MPI launcher run at once (default: the number of CPUs), twice as many "
                             "of the others; each row's time is its own run's")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error("--jobs %d: not a positive number" % args.jobs)
    if args.part != "both" and not args.merge:
        parser.error("--part is for --merge: without it the whole table is written")
    if args.merge and not os.path.exists(args.output):
        parser.error("--merge %s: no table there to keep rows of" % args.output)
    build = os.path.abspath(args.build)
    if not os.path.exists(os.path.join(build, "dpcheck")):
        sys.exit("%s: no dpcheck here; build first (bash ci/build.sh)" % build)

    def go(rows, label):
        # Rows whose ranks are processes under an MPI launcher poll for messages and keep their CPUs busy:
        # they run args.jobs at a time, after the others. The others (ranks as threads, or PyTorch's
        # processes over Gloo) spend most of their time waiting on sockets and timeouts (a quick Gloo row:
        # 3.8 s of its 6.8 in the absent-rank probe), so twice as many of them run at once. Each is
        # printed as it ends, in table order within its group.
        polling = [r for r in rows if r.polls()]
        waiting = [r for r in rows if not r.polls()]
        done = 0
        for group, jobs in ((waiting, 2 * args.jobs), (polling, args.jobs)):
            with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
                ended = [pool.submit(run, r, build) for r in group]
                for r, end in zip(group, ended):
                    end.result()
                    done += 1
                    print("[%s %d/%d] %-9s %-18s N=%s  %-5s %6.1f s  %s" % (
                        label, done, len(rows), r.library, r.algorithm, r.world, r.verdict, r.seconds,
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
        ran = {r.key() for r in rows}
        for key in committed:
            if key not in ran and (not args.only or re.search(args.only, " ".join(key))):
                changed.append("%s: in the committed subset, not run here (its library or adapter is not built)" %
                               " ".join(key))
        for line in changed:
            print("CHANGED " + line)
        print("ci/validate-libraries.sh --check: %d rows, %s" % (
            len(rows), "%d changed" % len(changed) if changed else "every verdict as committed"))
        return 1 if changed else 0

    schedules = ""
    if os.path.exists(args.output) and BEGIN_SCHEDULES in open(args.output).read():
        kept = open(args.output).read().split(BEGIN_SCHEDULES, 1)[1].split(END_SCHEDULES, 1)[0]
        schedules = BEGIN_SCHEDULES + kept + END_SCHEDULES + "\n\n"
    full_rows = go(rows_for(build, False, args.only), "full") if args.part != "subset" else []
    quick_rows = go(rows_for(build, True, args.only), "subset") if args.part != "full" else []
    if args.merge:
        old = open(args.output).read()
        kept_full = table_rows(old.split("## The table", 1)[1].split("## ", 1)[0].split(BEGIN_SCHEDULES, 1)[0])
        kept_quick = table_rows(old.split(BEGIN_QUICK, 1)[1].split(END_QUICK, 1)[0])
        full = merged([r.key() for r in rows_for(build, False, "")], table_rows(table(full_rows, build)), kept_full)
        quick = merged([r.key() for r in rows_for(build, True, "")], table_rows(table(quick_rows, build)), kept_quick)
    else:
        full, quick = table(full_rows, build), table(quick_rows, build)
    text = """# What dpcheck says about real libraries

Generated by `ci/validate-libraries.sh` (do not edit by hand); each row is `dpcheck conform` run as a user
runs it, on the machine and library versions below. CI runs the subset at the end (N = 2 and 3, small
buffers, no properties, and the `--schedule` rows: `ci/validate-libraries.sh --check`) and fails when a
verdict changes.

- **Gloo**: `examples/comm_gloo` under `DPCHECK_GLOO_ALGORITHM=<algorithm>`, ranks as threads over TCP on
  127.0.0.1; "float16 declared" is the same adapter built to declare float16 too
  (`libdpcheck_comm_gloo_float16.so`).
- **Open MPI**: `OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allreduce_algorithm=<k> mpirun -np N
  dpcheck conform --comm mpi-native`: MPI's own `MPI_Allreduce` under each tuned algorithm.
- **MPICH**: `MPIR_CVAR_DEVICE_COLLECTIVES=none MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=<a> mpiexec.mpich -n N
  dpcheck-mpich conform --comm mpi-native --allreduce-only --no-properties --max-mib 1`: dpcheck built against MPICH
  (`dpcheck-mpich`), MPICH's own `MPI_Allreduce` under each blocking algorithm, and under `nb` each
  non-blocking one (`MPIR_CVAR_IALLREDUCE_INTRA_ALGORITHM`), with `MPIR_CVAR_IALLREDUCE_RECEXCH_KVAL` or
  `..._TREE_KVAL` at 2, 3 and 4 where the algorithm takes a k. The variables choose the all-reduce alone,
  so its checks alone run (`--allreduce-only`): MPICH's ranks poll without yielding, and on two cores a
  whole suite at N = 9 takes six minutes a row. MPICH falls back silently
  (`MPIR_CVAR_COLLECTIVE_FALLBACK=silent`): `reduce_scatter_allgather` below a power of two of elements, and
  `smp` on a single node's communicator of roots, hand the call to its automatic choice.
- **OpenBLAS, BLIS, oneDNN**: `examples/kernels_blas` and `examples/kernels_onednn` as kernel plugins of the
  CPU engine (linear forward and backward); N is the world of verify's properties with them.
- **PyTorch ProcessGroupGloo**: `PYTHONPATH=build/python python3 -m dpcheck.launch -n N -m dpcheck.conform`
  (docs/torch.md, "PyTorch's own process group judged"): conform's communicator checks, no properties, on
  `torch.distributed`'s all_reduce, broadcast, all_gather and barrier over `init_process_group("gloo")`, one
  process per rank, each call on a tensor that views conform's buffer. What the group raises on for one
  element on every rank (`ReduceOp.AVG`, bfloat16) is `unsupported`; an all_gather of zero elements ends
  the process (SIGFPE, pytorch/pytorch#85234), so it is not called and its row fails at `count=0`.
- **NCCL** (`examples/comm_nccl`) joins the table where `nvidia-smi` lists a GPU: one rank per GPU, its
  default and each `NCCL_ALGO` (Ring, Tree) with each `NCCL_PROTO` (LL, LL128, Simple), and with two GPUs
  or more the schedule each algorithm claims (`--schedule ring`, `--schedule tree`).

A verdict of `FAIL` is the library's: the evidence that it is the library and not the adapter is in the
adapters' READMEs (`examples/comm_gloo/README.md`) and in the notes below. A verdict of `switches` is a
`--schedule` row whose schedule the library follows at some counts and, at the others, leaves for another
schedule whose bits it gives exactly: the row says where and to what. The library promised no schedule, so
this is no failure of it; the library schedules (`open-mpi-ring`, `open-mpi-rabenseifner`) model the switch
and are exact at every count. `unsupported` counts the checks of a dtype or op the
plugin does not declare. Gloo's bcube at N = 4 races (its run waits for the peers of its first step
only), so which of its checks fails first changes from run to run; the CI subset (N = 2 and 3) holds no
such row. At N = 3 it sums wrongly at the first check, in every run.

## Notes on the failing rows of MPICH and PyTorch

- **Recursive exchange with k = 3 or 4** (`tsp_recexch_single_buffer`, `tsp_recexch_multiple_buffer`):
  the ranks end with different bits. Within each group of k ranks every rank folds its k - 1 neighbours
  into its own buffer in an order relative to itself (src/mpi/coll/iallreduce/iallreduce_tsp_recexch.c,
  4.0.2), so the additions are grouped differently on each rank; with k = 2 there is one neighbour and the
  bits agree. MPICH's maintainers say the same in their test for it, pmodels/mpich pull request 6538
  ("test/coll: add test allred_float": "different ranks are doing the reduction with different
  associativity. This is fixable."), fixed in 4.2.0 for the blocking recursive exchange only (commit
  ba1b4dd1e5, "coll/allreduce: fix allreduce_intra_recexch for float"); 4.0.2's non-blocking one is as
  measured here.
- **PyTorch's ProcessGroupGloo, float16** (`allreduce float16 max` from N = 2, `allreduce float16 sum` at
  N = 4): the very elements and values of the "Gloo, float16 declared" rows (N = 3: element 2307 is
  -0.118225098, bits 0xaf91, where the max is 44960; N = 4: element 2330 is 6768 where the sum is 28320).
  PyTorch's Gloo reduces float16 with Gloo's own `gloo::float16` (`torch/csrc/distributed/c10d/
  ProcessGroupGloo.cpp`, `GENERATE_ALL_TYPES`: `at::ScalarType::Half` runs as `gloo::float16`), whose copy assignment compares the new
  value with the old bits read as an integer and skips the store when they look equal
  (`examples/comm_gloo/README.md` quotes the code and counts how often it bites).

## Versions

%s

## The table

%s

%s## The CI subset

%s
%s
%s
""" % (versions(), full, schedules, BEGIN_QUICK, quick, END_QUICK)
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    tmp = args.output + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, args.output)
    print("wrote " + args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
