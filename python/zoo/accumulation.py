"""Gradient accumulation over micro-batches of unequal size (a rank's 5 examples as 3 and 2), each
micro-batch's mean divided by the number of micro-batches: the examples weigh 1/(N 6) and 1/(N 4), not
1/(N 5) (huggingface/transformers#24725). The fixed version divides each micro-batch's summed loss by the
rank's examples. Caught by the gradient check, which names the micro-batches' weights."""

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import zoo_common as zoo
from dpcheck.torch import Monitor

args = zoo.parse(__doc__)
rank, world = zoo.join()


def main():
    model = DDP(zoo.mlp(), broadcast_buffers=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = zoo.data(5 * world)[:]
    monitor = Monitor(model, opt, loss="mse", gradient_every=1)
    for step in range(args.steps):
        xs, ys = x[rank::world], y[rank::world]
        micro = [(xs[:3], ys[:3]), (xs[3:], ys[3:])]
        opt.zero_grad()
        for i, (mx, my) in enumerate(micro):
            out = model(mx)
            if args.correct:
                loss = F.mse_loss(out, my, reduction="sum") / (len(xs) * out.shape[1])
            else:
                loss = F.mse_loss(out, my) / len(micro)
            if i + 1 < len(micro):
                with model.no_sync():
                    loss.backward()
            else:
                loss.backward()
            monitor.micro_batch(mx, my)
        opt.step()
        monitor.step()
    monitor.close()


zoo.run(main)
