"""DistributedSampler over 101 examples on 3 ranks pads the shares to 34 each by drawing examples twice
(documented; pytorch/pytorch#25162). A job that needs every example exactly once per epoch asks for
strict shares, and the padding fails it; the fixed version accepts the documented padding, which the
check reports by name without failing."""

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

import zoo_common as zoo
from dpcheck.torch import Monitor

args = zoo.parse(__doc__, examples=(int, 101, "the data set's size (default 101)"))
rank, world = zoo.join()


def main():
    model = DDP(zoo.mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    dataset = zoo.data(args.examples)
    sampler = DistributedSampler(dataset, shuffle=True, seed=5)
    loader = DataLoader(dataset, batch_size=17, sampler=sampler)
    monitor = Monitor(model, opt, sampler=sampler, loss="mse", strict_shares=not args.correct)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            monitor.step(x, y)
    monitor.close()


zoo.run(main)
