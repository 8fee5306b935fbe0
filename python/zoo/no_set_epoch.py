"""A DistributedSampler that shuffles, without set_epoch: every epoch repeats the first one's order.
The fixed version calls sampler.set_epoch(epoch) before each epoch. Caught by the sampler check."""

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

import zoo_common as zoo
from dpcheck.torch import Monitor

args = zoo.parse(__doc__)
rank, world = zoo.join()


def main():
    model = DDP(zoo.mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    dataset = zoo.data(12 * world)
    sampler = DistributedSampler(dataset, shuffle=True, seed=3)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler)
    monitor = Monitor(model, opt, loader=loader, loss="mse")
    for epoch in range(3):
        if args.correct:
            sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            monitor.step(x, y)
    monitor.close()


zoo.run(main)
