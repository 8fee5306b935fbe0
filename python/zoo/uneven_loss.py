"""Uneven shares (10 examples on 3 ranks: 4, 3 and 3) with the loss averaged per rank: DDP averages the
ranks' means, which weighs rank 0's examples 1/12 and the others' 1/9 where the whole batch's mean weighs
each 1/10. The fixed version scales each rank's summed loss by N / B. Caught by the gradient check, which
names the weights."""

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import zoo_common as zoo
from dpcheck.torch import Monitor

args = zoo.parse(__doc__, bundles=True, examples=(int, 10, "the global batch (default 10)"))
rank, world = zoo.join()


def main():
    model = DDP(zoo.mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = zoo.data(args.examples)[:]
    monitor = Monitor(model, opt, loss=torch.nn.MSELoss(), gradient_every=1, bundle_dir=args.bundle_dir)
    for step in range(args.steps):
        xs, ys = x[rank::world], y[rank::world]  # uneven when the batch is not a multiple of the ranks
        opt.zero_grad()
        out = model(xs)
        if args.correct:
            # The whole batch's mean: each rank's sum over its examples, times N (DDP divides by N) over B.
            loss = F.mse_loss(out, ys, reduction="sum") * world / (args.examples * out.shape[1])
        else:
            loss = F.mse_loss(out, ys)
        loss.backward()
        opt.step()
        monitor.step(xs, ys)
    monitor.close()


zoo.run(main)
