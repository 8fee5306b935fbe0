"""A resume that restores the optimizer's state on rank 0 alone (the others start from a fresh optimizer,
as when only rank 0 finds the checkpoint file): the momentum differs across ranks and the replicas part at
the first step after the resume. The fixed version restores it on every rank. Caught by the replica
check, in the optimizer's state."""

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import zoo_common as zoo
from dpcheck.torch import Monitor

args = zoo.parse(__doc__)
rank, world = zoo.join()


def main():
    model = DDP(zoo.mlp())
    x, y = zoo.data(6 * world)[:]

    def train(opt, steps, monitor=None):
        for _ in range(steps):
            xs, ys = x[rank::world], y[rank::world]
            opt.zero_grad()
            F.mse_loss(model(xs), ys).backward()
            opt.step()
            if monitor:
                monitor.step(xs, ys)

    first = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    train(first, 2)
    saved = first.state_dict()  # what the checkpoint holds: every rank has the same
    resumed = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if args.correct or rank == 0:
        resumed.load_state_dict(saved)
    monitor = Monitor(model, resumed, loss="mse", gradient_every=1)
    train(resumed, args.steps, monitor)
    monitor.close()


zoo.run(main)
