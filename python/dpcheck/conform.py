"""`dpcheck conform` for PyTorch's own process group: conform's communicator checks on torch.distributed.

    python3 -m dpcheck.launch -n 3 -m dpcheck.conform [--check NAME [--case TEXT]] [--schedule NAME]
                                                      [--report FILE] [--max-mib X] [--thorough] [--seed N]

Every rank joins a process group (``init_process_group("gloo")``, the launcher's env:// variables) and runs
dpcheck conform's communicator checks on it, in C++ (python/conform_host.cpp): each collective is
torch.distributed's own (all_reduce, broadcast, all_gather, barrier) on a tensor that views dpcheck's
buffer, so the bits judged are the ones the group wrote. Rank 0 prints conform's table, and with --report
writes the JSON report that ``dpcheck conform --report`` writes. A collective, dtype or op the group
refuses (an error on every rank when called on one element: Gloo has no ReduceOp.AVG and no bfloat16) is
reported "unsupported" with the group's error, not run. Exit status: 0 every promise kept, 1 a check
failed, 2 bad usage (one line), 3 a runtime error.
"""

import argparse
import datetime
import os
import re
import shlex
import signal
import subprocess
import sys

PROG = "python3 -m dpcheck.conform"


class ProcessGroupComm:
    """dpcheck's collectives on a torch.distributed group: what the C++ side calls. Each buffer arrives as a
    NumPy array of bytes over dpcheck's memory, and the dtype as PyTorch's name; the tensor handed to
    torch.distributed views those bytes, so the group writes dpcheck's buffer itself."""

    def __init__(self, group=None):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.group = torch, dist, group
        self.size = dist.get_world_size(group)
        self.dtypes = {name: getattr(torch, name) for name in
                       ("float32", "float64", "int32", "int64", "uint8", "bfloat16", "float16")}
        self.sizes = {name: torch.empty(0, dtype=t).element_size() for name, t in self.dtypes.items()}
        self.ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN,
                    "max": dist.ReduceOp.MAX}
        # Why an all_gather of zero elements is not called (it ends the process), or None: see
        # empty_all_gather_probe.
        self.empty_all_gather = None

    def tensor(self, buf, dtype):
        return self.torch.from_numpy(buf).view(self.dtypes[dtype])

    def all_reduce(self, buf, dtype, op):
        self.dist.all_reduce(self.tensor(buf, dtype), op=self.ops[op], group=self.group)

    def broadcast(self, buf, dtype, root):
        self.dist.broadcast(self.tensor(buf, dtype), src=root, group=self.group)

    def all_gather(self, send, recv, dtype):
        if len(send) == 0 and self.empty_all_gather:
            raise RuntimeError(self.empty_all_gather)
        out, count = self.tensor(recv, dtype), len(send) // self.sizes[dtype]
        self.dist.all_gather([out[r * count:(r + 1) * count] for r in range(self.size)], self.tensor(send, dtype),
                             group=self.group)

    def barrier(self):
        self.dist.barrier(group=self.group)


class Parser(argparse.ArgumentParser):
    """argparse whose refusal is one line, "python3 -m dpcheck.conform: error: ...", and exit status 2."""

    def error(self, message):
        refuse(message)


def refuse(message):
    print("%s: error: %s" % (PROG, message), file=sys.stderr)
    sys.exit(2)


def parse(argv):
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0],
               epilog="Run it under a launcher: python3 -m dpcheck.launch -n N -m dpcheck.conform [OPTIONS]")
    p.add_argument("--check", default="", help="run this check alone (see --list-checks)")
    p.add_argument("--case", default="",
                   help='with --check: run this case alone, as a failure prints it ("count=5 offset=1")')
    p.add_argument("--schedule", default="",
                   help="the all-reduce schedule the group claims (any that dpcheck conform --schedule takes: "
                        "ring, tree, halving-doubling, rank-order, linear, hierarchical:G, ...): its bits are checked against the schedule's "
                        "emulation")
    p.add_argument("--seed", type=int, default=1, help="seed of the random inputs (default 1)")
    p.add_argument("--max-mib", type=float, default=None,
                   help="the largest buffer a collective check passes, in MiB (default 16; 64 with --thorough)")
    p.add_argument("--thorough", action="store_true", help="the full sweep (buffers to 64 MiB, more counts)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds a collective may take before the group gives up (init_process_group's timeout; "
                        "default 60)")
    p.add_argument("--backend", default="gloo", help="torch.distributed's backend (default gloo; CPU tensors)")
    p.add_argument("--report", default="", help="write the JSON report (as dpcheck conform --report) to this file")
    p.add_argument("--quiet", action="store_true",
                   help="accepted as dpcheck conform takes it: there is no progress line")
    p.add_argument("--list-checks", action="store_true", help="print the checks' names, one a line, and exit")
    p.add_argument("--empty-all-gather-probe", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.seed < 0:
        refuse("--seed %d: give a number from 0" % a.seed)
    if a.max_mib is not None and not 0 <= a.max_mib <= 4096:
        refuse("--max-mib %g: must be in [0, 4096]" % a.max_mib)
    if not a.timeout > 0:
        refuse("--timeout %g: give a positive number of seconds" % a.timeout)
    if a.backend != "gloo":
        refuse("--backend %s: the checks pass CPU tensors, which gloo takes; no other backend is checked" % a.backend)
    return a


def replay_prefix(a, world):
    """The command line a row's replay begins with; conform adds --check and --case."""
    words = "python3 -m dpcheck.launch -n %d -m dpcheck.conform" % world
    if a.schedule:
        words += " --schedule " + shlex.quote(a.schedule)
    if a.thorough:
        words += " --thorough"
    if a.max_mib is not None:
        words += " --max-mib %g" % a.max_mib
    if a.seed != 1:
        words += " --seed %d" % a.seed
    return words


def empty_all_gather_probe(timeout):
    """Whether an all_gather of zero-element tensors ends the process, found in a world of two processes of
    its own (a signal there cannot end this run): None when it returns, else why it is not called."""
    cmd = [sys.executable, "-m", "dpcheck.launch", "-n", "2", "--no-prefix", "--timeout", "%g" % timeout,
           "-m", "dpcheck.conform", "--empty-all-gather-probe"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode == 0:
        return None
    if done.returncode == 124:  # the launcher's --timeout
        return ("all_gather of zero-element tensors did not return within %g s (float32, in a world of 2 processes of "
                "its own at start-up), so it is not called here" % timeout)
    how = "exit status %d" % done.returncode
    if done.returncode > 128:
        try:
            how = signal.Signals(done.returncode - 128).name
        except ValueError:
            pass
    return ("all_gather of zero-element tensors ends the process (%s, float32, in a world of 2 processes of its own at "
            "start-up), so it is not called here" % how)


def host_program():
    """conform-host beside this file (python/conform_host.cpp): a Python interpreter with conform built in."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "conform-host")


def run_in_host(argv):
    """This command again, in conform-host: as the same module (-m) or the same script, with the same
    arguments. conform's C++ is there rather than in dpcheck._core (python/conform_host.cpp says why)."""
    host = host_program()
    if not os.access(host, os.X_OK):
        print("%s: error: %s: not built (cmake --build build --target dpcheck_python)" % (PROG, host), file=sys.stderr)
        sys.exit(3)
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    start = ["-m", spec.name] if spec is not None and spec.name else [os.path.abspath(sys.argv[0])]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(host, [host] + start + list(argv))


def main(argv=None, comm_class=ProcessGroupComm):
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    try:
        import _dpcheck_conform as core
    except ImportError:
        run_in_host(argv)

    if a.list_checks:
        for name in core.conform_checks():
            print(name)
        return 0
    env_world = os.environ.get("WORLD_SIZE", "")
    try:
        core.check_conform_request(a.check, a.case, a.schedule, int(env_world) if env_world.isdigit() else 1)
    except core.UsageError as e:
        refuse(str(e))
    if not env_world.isdigit() or not os.environ.get("RANK", "").isdigit():
        refuse("not started by a launcher (RANK and WORLD_SIZE unset): python3 -m dpcheck.launch -n N -m "
               "dpcheck.conform [OPTIONS]")
    rank, world = int(os.environ["RANK"]), int(env_world)
    try:
        if a.report and rank == 0:
            core.check_output_path(a.report, "--report")
    except core.UsageError as e:
        refuse(str(e))

    import torch
    import torch.distributed as dist

    if a.empty_all_gather_probe:
        dist.init_process_group(a.backend, timeout=datetime.timedelta(seconds=a.timeout))
        dist.all_gather([torch.zeros(0) for _ in range(world)], torch.zeros(0))
        dist.destroy_process_group()
        return 0
    # The probe runs only where a check may gather zero elements: the all-gathers' own checks from count 0.
    count_zero = not a.case or re.match(r"\s*count=0(\s|$)", a.case)
    probe = rank == 0 and count_zero and (not a.check or a.check.startswith("allgather "))
    empty_all_gather = empty_all_gather_probe(a.timeout) if probe else None
    try:
        dist.init_process_group(a.backend, timeout=datetime.timedelta(seconds=a.timeout))
        comm = comm_class()
        # Rank 0's finding for every rank: a rank that calls while another does not would wait for it.
        said = [empty_all_gather]
        dist.broadcast_object_list(said, src=0)
    except RuntimeError as e:
        print("%s: error: the process group did not start: %s" % (PROG, str(e).splitlines()[0]), file=sys.stderr)
        return 3
    comm.empty_all_gather = said[0]
    library = "PyTorch %s ProcessGroup%s" % (torch.__version__, a.backend.capitalize())
    request = {"backend": a.backend, "library": library, "version": torch.__version__, "seed": a.seed,
               "thorough": a.thorough, "max_mib": -1.0 if a.max_mib is None else a.max_mib, "check": a.check,
               "case": a.case, "schedule": a.schedule, "timeout": a.timeout, "replay_prefix": replay_prefix(a, world)}

    def say(text):
        sys.stdout.write(text)
        sys.stdout.flush()

    try:
        out = core.conform_process_group(comm, rank, world, request, say)
    except core.Error as e:  # UsageError among them: a --check that matched no check
        print("%s: error: %s" % (PROG, e), file=sys.stderr)
        return 2 if isinstance(e, core.UsageError) else 3
    finally:
        dist.destroy_process_group()
    if a.report and rank == 0:
        core.write_file(a.report, out["report"])
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
