"""What the zoo's scripts share: joining the ranks (as torchrun or dpcheck.launch start them), a small
model and data set, and the command line every script takes (--correct runs the fixed version)."""

import argparse
import os
import sys

import torch
import torch.distributed as dist


def parse(description: str, bundles: bool = False, **extra) -> argparse.Namespace:
    """The zoo's command line; with bundles, also --bundle-dir (for scripts whose model is in the family
    dpcheck's gradient check covers)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--correct", action="store_true", help="run the fixed version of the script")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps (default 4)")
    if bundles:
        p.add_argument("--bundle-dir", default=None, help="write a repro bundle here when a check fails")
    for name, (kind, default, text) in extra.items():
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=default, help=text)
    return p.parse_args()


def join() -> tuple:
    """Joins the process group over gloo from the environment; returns (rank, world size)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    return dist.get_rank(), dist.get_world_size()


def mlp(dims=(6, 8, 3), seed: int = 0, activation=torch.nn.ReLU) -> torch.nn.Sequential:
    """Linear layers with one activation between them: the family dpcheck's gradient check covers."""
    torch.manual_seed(seed)
    layers = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(activation())
    return torch.nn.Sequential(*layers)


def data(n: int, dims=(6, 8, 3), seed: int = 1, classes: bool = False) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dims[0], generator=g)
    y = torch.randint(0, dims[-1], (n,), generator=g) if classes else torch.randn(n, dims[-1], generator=g)
    return torch.utils.data.TensorDataset(x, y)


def run(main) -> None:
    """Runs the script's body; a failed dpcheck check (raised on every rank at once) ends each rank with
    exit status 1 after leaving the process group, where an exception left uncaught would abort in
    gloo's threads."""
    from dpcheck.torch import CheckFailed
    try:
        main()
        dist.barrier()
        status = 0
    except CheckFailed:
        status = 1
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without the interpreter's teardown, where gloo's threads sometimes abort the process
    # ("terminate called without an active exception") after the job itself has finished.
    os._exit(status)
