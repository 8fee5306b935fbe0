"""Starts N ranks of a training script on this machine, as torchrun does.

    python3 -m dpcheck.launch --nproc 3 train.py [ARGS...]
    python3 -m dpcheck.launch --nproc 3 -m package.module [ARGS...]

Each rank is a process of the same Python running the script, with RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, so that
``torch.distributed.init_process_group("gloo")`` (the env:// method) joins them. Rank r's output lines
are prefixed with "[r] " unless --no-prefix. The launcher exits with the first non-zero exit status of
a rank (0 when every rank succeeded), and stops the other ranks when one fails and they do not end
within --grace seconds. It exists because Debian 12's torchrun (PyTorch 1.13 on Python 3.11) fails at
start; under ``dpcheck audit`` it is the launcher whose processes are audited.

With ``--preload MODULE`` (repeatable) the launcher imports the modules once and forks each rank from
itself, instead of starting a new interpreter per rank, as multiprocessing's forkserver preloads, so that
no rank imports torch again (on two cores a 3-rank zoo job took 3.1 s of CPU instead of 5.3). A forked
rank runs the script as ``__main__`` with its own ``sys.argv``, ``sys.path[0]`` and environment, and
exits as the interpreter would; what the preloaded modules hold (a random generator seeded at import,
such as NumPy's) is each rank's copy of the launcher's. Not under ``dpcheck audit``, which counts
processes as they start a program.
"""

import argparse
import importlib
import os
import runpy
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pump(stream, prefix: str, sink) -> None:
    for line in iter(stream.readline, b""):
        sink.buffer.write(prefix.encode() + line)
        sink.buffer.flush()


class ForkedRank:
    """A rank forked from the launcher, with the part of subprocess.Popen's interface that main uses."""

    def __init__(self, pid: int, stdout, stderr):
        self.pid, self.stdout, self.stderr, self.returncode = pid, stdout, stderr, None

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self):
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)


def fork_rank(env: dict, module: bool, script: str, args: list, inherited: list) -> ForkedRank:
    """Forks a rank that runs the script (or module) in this interpreter, its output on two pipes. The
    child never returns: the script's end, its sys.exit or its uncaught exception ends the process as it
    would end `python3 script.py`. Called before any thread of the launcher starts."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
        for f in inherited:  # the earlier ranks' pipes, closed through their file objects, which own them
            f.close()
        os.environ.update(env)
        sys.argv = [script, *args]
        try:
            if module:
                runpy.run_module(script, run_name="__main__", alter_sys=True)
            else:
                sys.path[0] = os.path.dirname(os.path.abspath(script))
                runpy.run_path(script, run_name="__main__")
        except SystemExit:
            raise
        except BaseException as e:  # noqa: BLE001 - printed as the interpreter prints an uncaught one
            # The traceback from the script's own frames on, without the launcher's and runpy's.
            ours = {__file__, os.path.abspath(__file__), runpy.__file__, "<frozen runpy>"}
            tb = e.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename in ours:
                tb = tb.tb_next
            traceback.print_exception(type(e), e, tb)
            sys.exit(1)
        sys.exit(0)
    os.close(out_w)
    os.close(err_w)
    rank = ForkedRank(pid, os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))
    inherited += [rank.stdout, rank.stderr]
    return rank


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m dpcheck.launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", "-n", type=int, required=True, help="ranks to start (at least 1)")
    parser.add_argument("--port", type=int, default=0, help="MASTER_PORT (default: a free port)")
    parser.add_argument("--grace", type=float, default=30.0,
                        help="seconds the other ranks get to end after one fails (default 30)")
    parser.add_argument("--timeout", type=float, default=0.0, help="stop every rank after this many seconds (0: never)")
    parser.add_argument("--no-prefix", action="store_true", help="do not prefix output lines with the rank")
    parser.add_argument("-m", "--module", action="store_true", help="the script is a module to run, as python3 -m")
    parser.add_argument("--preload", action="append", default=[], metavar="MODULE",
                        help="import MODULE once in the launcher and fork every rank from it rather than start a "
                             "new interpreter per rank (repeatable; e.g. torch)")
    parser.add_argument("script", help="the training script (with -m, a module's name)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = parser.parse_args(argv)
    if a.nproc < 1:
        parser.error(f"--nproc {a.nproc}: give at least 1")
    if not a.module and not os.path.isfile(a.script):
        parser.error(f"{a.script}: no such file")
    if a.preload and os.environ.get("DPCHECK_AUDIT_LOG"):
        # dpcheck audit counts each process, and learns its rank, as the process starts a program; a
        # forked rank starts none, so the audit could not tell which ranks it saw.
        parser.error("--preload: under dpcheck audit every rank must start its own interpreter, which the audit "
                     "counts as it starts; run without --preload")
    for name in a.preload:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any failure of the import is the user's input to name
            parser.error(f"--preload {name}: {type(e).__name__}: {e}")
    port = a.port or free_port()
    procs = []
    pumps = []
    inherited = []
    for rank in range(a.nproc):
        ranks_env = dict(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(a.nproc),
                         LOCAL_WORLD_SIZE=str(a.nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if a.preload:
            procs.append(fork_rank(ranks_env, a.module, a.script, a.args, inherited))
        else:
            procs.append(subprocess.Popen([sys.executable, *(["-m"] if a.module else []), a.script, *a.args],
                                          env=dict(os.environ, **ranks_env), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE))
    # The output pumps start once every rank is forked: a fork copies only the thread that calls it.
    for rank, p in enumerate(procs):
        prefix = "" if a.no_prefix else f"[{rank}] "
        for stream, sink in ((p.stdout, sys.stdout), (p.stderr, sys.stderr)):
            t = threading.Thread(target=pump, args=(stream, prefix, sink), daemon=True)
            t.start()
            pumps.append(t)
    start = time.monotonic()
    first_failure = 0
    failed_at = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        for p in procs:
            if p.returncode not in (None, 0) and not first_failure:
                first_failure = p.returncode
                failed_at = now
        if (failed_at is not None and now - failed_at > a.grace) or (a.timeout and now - start > a.timeout):
            for p in procs:
                if p.poll() is None:
                    p.kill()
            if not first_failure:
                first_failure = 124
                print(f"dpcheck.launch: stopped every rank after {a.timeout:g} s", file=sys.stderr)
        time.sleep(0.05)
    for t in pumps:
        t.join()
    for p in procs:
        if p.returncode != 0 and not first_failure:
            first_failure = p.returncode
    if first_failure < 0:  # killed by a signal
        first_failure = 128 - first_failure
    return first_failure


if __name__ == "__main__":
    sys.exit(main())
