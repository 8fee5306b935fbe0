"""An example DDP job with every dpcheck.torch check on: an MLP trained with SGD (or Adam) over gloo on a
fixed global batch split among the ranks, so that runs on different numbers of ranks train on the same
examples and differ only by rounding. Run it with the launcher:

    PYTHONPATH=build/python python3 -m dpcheck.launch --nproc 4 python/examples/ddp_mlp.py --trace run4.jsonl
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from dpcheck.torch import CheckFailed, Monitor

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--dims", default="16,32,32,4", help="layer widths (default 16,32,32,4)")
p.add_argument("--global-batch", type=int, default=24, help="examples a step over all ranks (default 24)")
p.add_argument("--steps", type=int, default=6, help="optimizer steps (default 6)")
p.add_argument("--gradient-every", type=int, default=2, help="check the gradient every K steps (default 2)")
p.add_argument("--trace", default=None, help="write dpcheck's trace to this new file")
p.add_argument("--optimizer", choices=["sgd", "momentum", "adam"], default="momentum",
               help="SGD, SGD with momentum 0.9 (the default) or Adam")
p.add_argument("--record", default=None, help="record every step into this new directory (for dpcheck drift)")
p.add_argument("--bundle-dir", default=None, help="write a repro bundle here when a check fails")
p.add_argument("--lr-rank1", type=float, default=None,
               help="a planted bug: rank 1's optimizer takes this learning rate instead")
args = p.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
dims = [int(d) for d in args.dims.split(",")]
torch.manual_seed(0)
layers = []
for i in range(len(dims) - 1):
    layers += [torch.nn.Linear(dims[i], dims[i + 1])] + ([torch.nn.ReLU()] if i + 2 < len(dims) else [])
model = DDP(torch.nn.Sequential(*layers))
lr = args.lr_rank1 if args.lr_rank1 is not None and rank == 1 else 0.05
if args.optimizer == "adam":
    opt = torch.optim.Adam(model.parameters(), lr=lr / 50)
else:
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9 if args.optimizer == "momentum" else 0)
g = torch.Generator().manual_seed(1)
x = torch.randn(args.steps, args.global_batch, dims[0], generator=g)
y = torch.randn(args.steps, args.global_batch, dims[-1], generator=g)
monitor = Monitor(model, opt, loss="mse", gradient_every=args.gradient_every, trace=args.trace,
                  record=args.record, bundle_dir=args.bundle_dir)
status = 0
try:
    for step in range(args.steps):
        xs, ys = x[step, rank::world], y[step, rank::world]
        opt.zero_grad()
        out = model(xs)
        # The global batch's mean: this rank's sum times N (DDP averages over the ranks) over B outputs.
        loss = F.mse_loss(out, ys, reduction="sum") * world / (args.global_batch * dims[-1])
        loss.backward()
        opt.step()
        monitor.step(xs, ys, loss=loss / world * args.global_batch / len(xs))
    monitor.close()
except CheckFailed:
    status = 1
dist.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(status)  # past the interpreter's teardown, where gloo's threads sometimes abort
