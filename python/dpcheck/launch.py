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
"""

import argparse
import os
import socket
import subprocess
import sys
import threading
import time


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pump(stream, prefix: str, sink) -> None:
    for line in iter(stream.readline, b""):
        sink.buffer.write(prefix.encode() + line)
        sink.buffer.flush()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m dpcheck.launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", "-n", type=int, required=True, help="ranks to start (at least 1)")
    parser.add_argument("--port", type=int, default=0, help="MASTER_PORT (default: a free port)")
    parser.add_argument("--grace", type=float, default=30.0,
                        help="seconds the other ranks get to end after one fails (default 30)")
    parser.add_argument("--timeout", type=float, default=0.0, help="stop every rank after this many seconds (0: never)")
    parser.add_argument("--no-prefix", action="store_true", help="do not prefix output lines with the rank")
    parser.add_argument("-m", "--module", action="store_true", help="the script is a module to run, as python3 -m")
    parser.add_argument("script", help="the training script (with -m, a module's name)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = parser.parse_args(argv)
    if a.nproc < 1:
        parser.error(f"--nproc {a.nproc}: give at least 1")
    if not a.module and not os.path.isfile(a.script):
        parser.error(f"{a.script}: no such file")
    port = a.port or free_port()
    procs = []
    pumps = []
    for rank in range(a.nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(a.nproc),
                   LOCAL_WORLD_SIZE=str(a.nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        p = subprocess.Popen([sys.executable, *(["-m"] if a.module else []), a.script, *a.args], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(p)
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
