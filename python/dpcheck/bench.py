"""What dpcheck.torch costs a real job, measured in one run.

    python3 -m dpcheck.bench [--nproc 2] [--dims 1024,2560,2560,1024] [--batch 512] [--steps 8] [--blocks 5]

Starts --nproc ranks of a DDP job over gloo (one thread each) training an MLP (ReLU, MSE, SGD with
momentum; the default has 11.8 million parameters, 512 examples a rank), and times blocks of steps in a
row, alternating without and with a Monitor (the replica check after every step; no gradient check),
so that both see the same machine. Prints the median step of each (a block's time over its steps), the
monitor's own time per step (its forward hook and monitor.step, timed inside), and that time less its
all-gather of the ranks' hashes (where a rank that ended its step first waits for the others, as it
would without a Monitor in the next step's all-reduce): its own work, the hashing and its bookkeeping.
All as ratios to the plain step, with the rate of dpcheck's XXH3 hashing on one core over a 256 MiB
buffer. Nothing is judged here: it prints figures, and exits 0.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np


def hashing_rate(mib: int = 256, repeats: int = 7) -> tuple:
    """GB/s of _core.hash over a buffer already touched (first touch is slow in some VMs), and of NumPy's
    float32 sum over the same buffer in the same run: a read of memory, the hash's ceiling. Repeats
    alternate the two; the medians."""
    from dpcheck import _core

    buf = np.ones(mib * 1024 * 1024 // 4, dtype=np.float32)
    _core.hash(buf)
    buf.sum()
    hashing, summing = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _core.hash(buf)
        hashing.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        buf.sum()
        summing.append(time.perf_counter() - t0)
    return buf.nbytes / statistics.median(hashing) / 1e9, buf.nbytes / statistics.median(summing) / 1e9


def hashing_text(rate: tuple) -> str:
    return (f"XXH3 hashing on one core: {rate[0]:.1f} GB/s; NumPy's float32 sum over the same 256 MiB in the "
            f"same run {rate[1]:.1f} GB/s (hash / sum {rate[0] / rate[1]:.2f})")


def worker(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dpcheck.torch import Monitor

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    dims = [int(d) for d in a.dims.split(",")]
    torch.manual_seed(0)
    layers = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(torch.nn.ReLU())
    net = torch.nn.Sequential(*layers)
    params = sum(p.numel() for p in net.parameters())
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(a.batch, dims[0], generator=g)
    y = torch.randn(a.batch, dims[-1], generator=g)

    monitor_time = [0.0]
    gather_time = [0.0]

    def step(monitor):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        if monitor is not None:
            t0 = time.perf_counter()
            monitor.step()
            monitor_time[0] += time.perf_counter() - t0

    for _ in range(2):  # warm-up: first touches, gloo's buffers, the optimizer's state
        step(None)
    # A block is --steps steps in a row, as a job runs them: a barrier before and after the block, none
    # between its steps, so that a rank that ends a step first waits where it would in a job (in the
    # Monitor's all-gather, or without one in the next step's all-reduce) and the wait is counted once.
    # A step's time is its block's over its steps; the Monitor's own time is each step's, measured inside.
    plain, checked, inside, gathering = [], [], [], []
    for _ in range(a.blocks):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step(None)
        dist.barrier()
        plain.append((time.perf_counter() - t0) / a.steps)
        monitor = Monitor(model, opt, out=open(os.devnull, "w"))
        # The hook's share is timed by wrapping it.
        hook = monitor._pre_forward

        def timed_hook(module, inputs, hook=hook):
            t0 = time.perf_counter()
            hook(module, inputs)
            monitor_time[0] += time.perf_counter() - t0

        monitor._hook.remove()
        monitor._hook = monitor.inner.register_forward_pre_hook(timed_hook)
        # And its all-gather of the ranks' hashes, where a rank that ended its step first waits for the others
        # (in a job without a Monitor it would wait as long in the next step's all-reduce).
        gather = monitor._all_gather_int64

        def timed_gather(values, gather=gather):
            t0 = time.perf_counter()
            out = gather(values)
            gather_time[0] += time.perf_counter() - t0
            return out

        monitor._all_gather_int64 = timed_gather
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            monitor_time[0] = gather_time[0] = 0.0
            step(monitor)
            inside.append(monitor_time[0])
            gathering.append(gather_time[0])
        dist.barrier()
        checked.append((time.perf_counter() - t0) / a.steps)
        monitor._hook.remove()
    if rank == 0:
        p, c, m = statistics.median(plain), statistics.median(checked), statistics.median(inside)
        w = statistics.median(i - g for i, g in zip(inside, gathering))
        state_bytes = 4 * params * 2  # parameters and momentum (the gradients only once replicas differ)
        rate = hashing_rate()
        row = {"dims": dims, "parameters": params, "batch_per_rank": a.batch, "ranks": world, "threads": a.threads,
               "torch": torch.__version__, "step_ms": p * 1e3, "checked_step_ms": c * 1e3, "monitor_ms": m * 1e3,
               "checked_over_plain": c / p, "monitor_over_step": m / p, "monitor_work_ms": w * 1e3,
               "monitor_work_over_step": w / p, "hash_gb_per_s": rate[0],
               "sum_gb_per_s": rate[1],
               "hashed_mb_per_step": state_bytes / 1e6}
        print(f"# dpcheck.torch's cost: MLP {a.dims} ({params / 1e6:.1f} M parameters), batch {a.batch} a rank, "
              f"{world} ranks of DDP over gloo, {a.threads} thread each, PyTorch {torch.__version__}; medians of "
              f"{a.blocks} alternating blocks of {a.steps} steps in a row each")
        print(f"{'what':<40} {'ms':>10} {'of the step':>12}")
        print(f"{'step (forward, MSE, backward, SGD)':<40} {p * 1e3:10.2f} {1.0:12.3f}")
        print(f"{'step with the Monitor':<40} {c * 1e3:10.2f} {c / p:12.3f}")
        print(f"{'the Monitor alone (hook + step)':<40} {m * 1e3:10.2f} {m / p:12.3f}")
        print(f"{'  less its all-gather (its own work)':<40} {w * 1e3:10.2f} {w / p:12.3f}")
        print(hashing_text(rate))
        print(f"hashed a step: {state_bytes / 1e6:.0f} MB of parameters and momentum after it, and the "
              f"{4 * params / 1e6:.0f} MB of parameters again before its forward pass")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(row, f)
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m dpcheck.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--dims", default="1024,2560,2560,1024", help="layer widths (default 1024,2560,2560,1024)")
    p.add_argument("--batch", type=int, default=512, help="examples a rank a step (default 512)")
    p.add_argument("--steps", type=int, default=8, help="steps in a row a block (default 8)")
    p.add_argument("--blocks", type=int, default=5, help="blocks of each kind, alternating (default 5)")
    p.add_argument("--threads", type=int, default=1, help="PyTorch threads a rank (default 1)")
    p.add_argument("--json", default="", help="also write the figures to this JSON file")
    p.add_argument("--hash-only", action="store_true", help="print the hashing rate alone and exit")
    a = p.parse_args(argv)
    for name in ("nproc", "batch", "steps", "blocks", "threads"):
        if getattr(a, name) < 1:
            p.error(f"--{name} {getattr(a, name)}: give at least 1")
    try:
        dims = [int(d) for d in a.dims.split(",")]
        if len(dims) < 2 or min(dims) < 1:
            raise ValueError
    except ValueError:
        p.error(f"--dims {a.dims}: give at least two positive widths, e.g. 1024,2560,1024")
    if a.hash_only:
        print(hashing_text(hashing_rate()))
        return 0
    if "RANK" in os.environ:
        worker(a)
        return 0
    from dpcheck import launch

    return launch.main(["--nproc", str(a.nproc), "--no-prefix", "-m", "dpcheck.bench",
                        *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    sys.exit(main())
