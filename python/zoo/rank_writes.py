"""Every rank saves the checkpoint (the bug: NVIDIA/apex#886 saved on local rank 0 of every node); the
fixed version saves on rank 0 alone. Caught by `dpcheck audit` around the launcher."""

import os
import tempfile

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import zoo_common as zoo

args = zoo.parse(__doc__, out=(str, "", "the checkpoint's directory (default: a new temporary one)"))
rank, world = zoo.join()


def main():
    model = DDP(zoo.mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = zoo.data(8 * world)[:]
    for _ in range(args.steps):
        opt.zero_grad()
        F.mse_loss(model(x[rank::world]), y[rank::world]).backward()
        opt.step()
    out = args.out or tempfile.gettempdir()
    if args.correct:
        if rank == 0:
            torch.save(model.module.state_dict(), os.path.join(out, "zoo-checkpoint.pt"))
    else:
        if int(os.environ.get("LOCAL_RANK", rank)) >= 0:  # "local rank 0 of every node": here, every rank
            torch.save(model.module.state_dict(), os.path.join(out, f"zoo-checkpoint-{rank}.pt"))


zoo.run(main)
