#!/usr/bin/env python3
"""dpcheck.launch starts ranks the same way whether each is a new interpreter or forked from the launcher
(--preload): the same environment, arguments, __name__, sys.path[0] and output lines, the script's exit
status, an uncaught exception's traceback and status 1, and atexit handlers run at the end.

    launch_test.py    (environment: PYTHONPATH holding the built package)
"""

import os
import subprocess
import sys
import tempfile

SCRIPT = r'''
import atexit, os, sys
rank = int(os.environ["RANK"])
atexit.register(lambda: print(f"atexit ran on {rank}", flush=True))
print(f"rank {rank} of {os.environ['WORLD_SIZE']} local {os.environ['LOCAL_RANK']}, argv {sys.argv[1:]}, "
      f"name {__name__}, path0 is the script's folder: {sys.path[0] == os.path.dirname(os.path.abspath(__file__))}")
mode = sys.argv[1]
if mode == "status" and rank == 1:
    sys.exit(3)
if mode == "raise" and rank == 0:
    raise ValueError("planted")
'''


def launch(tmp, mode, preload):
    cmd = [sys.executable, "-m", "dpcheck.launch", "--nproc", "2", "--grace", "20",
           *(["--preload", "json"] if preload else []), os.path.join(tmp, "job.py"), mode, "x y"]
    r = subprocess.run(cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return r.returncode, r.stdout


def main() -> int:
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "job.py"), "w") as f:
            f.write(SCRIPT)
        for mode, status in (("ok", 0), ("status", 3), ("raise", 1)):
            runs = {preload: launch(tmp, mode, preload) for preload in (False, True)}
            for preload, (code, out) in runs.items():
                how = "forked" if preload else "new interpreters"
                print(f"--- {mode}, {how}: exit {code}\n{out}")
                if code != status:
                    problems.append(f"{mode} ({how}): exit {code}, expected {status}")
                for rank in (0, 1):
                    line = (f"[{rank}] rank {rank} of 2 local {rank}, argv ['{mode}', 'x y'], name __main__, "
                            "path0 is the script's folder: True")
                    if line not in out.splitlines():
                        problems.append(f"{mode} ({how}): no line {line!r}")
                    if mode != "raise" or rank != 0:
                        if f"[{rank}] atexit ran on {rank}" not in out.splitlines():
                            problems.append(f"{mode} ({how}): rank {rank}'s atexit handler did not run")
                if mode == "raise" and not any(l.startswith("[0] ValueError: planted") for l in out.splitlines()):
                    problems.append(f"raise ({how}): no traceback ending in ValueError: planted from rank 0")
            if sorted(runs[False][1].splitlines()) != sorted(runs[True][1].splitlines()):
                problems.append(f"{mode}: the forked ranks' lines differ from the new interpreters'")
    print("; ".join(problems) if problems else "launch: forked ranks run as new interpreters do")
    print("1 passed, 0 failed" if not problems else "0 passed, 1 failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
