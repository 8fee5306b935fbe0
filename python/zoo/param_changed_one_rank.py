"""A parameter changed on one rank outside the optimizer's step (a rank-dependent branch that clips, or
"fixes", a weight). The fixed version applies the change on every rank. Caught by the replica check,
placed outside the step."""

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import zoo_common as zoo
from dpcheck.torch import Monitor

args = zoo.parse(__doc__)
rank, world = zoo.join()


def main():
    model = DDP(zoo.mlp())
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = zoo.data(8 * world)[:]
    monitor = Monitor(model, opt, loss="mse", gradient_every=2)
    for step in range(args.steps):
        if step == 2 and (args.correct or rank == world - 1):
            with torch.no_grad():
                model.module[2].weight.clamp_(-0.1, 0.1)
        xs, ys = x[rank::world], y[rank::world]
        opt.zero_grad()
        F.mse_loss(model(xs), ys).backward()
        opt.step()
        monitor.step(xs, ys)
    monitor.close()


zoo.run(main)
