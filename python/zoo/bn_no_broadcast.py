"""BatchNorm under DDP with broadcast_buffers=False: each rank's running statistics follow its own shard,
so the replicas part at the first step. The fixed version keeps DDP's default broadcast_buffers=True,
which makes the buffers rank 0's at every forward pass. Caught by the replica check, in a buffer."""

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import zoo_common as zoo
from dpcheck.torch import Monitor

args = zoo.parse(__doc__)
rank, world = zoo.join()


def main():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    model = DDP(net, broadcast_buffers=args.correct)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = zoo.data(8 * world)[:]
    monitor = Monitor(model, opt, loss="mse", gradient_every=1)
    for step in range(args.steps):
        xs, ys = x[rank::world], y[rank::world]
        opt.zero_grad()
        F.mse_loss(model(xs), ys).backward()
        opt.step()
        monitor.step(xs, ys)
    monitor.close()


zoo.run(main)
