#!/usr/bin/env python3
"""PyTorch baseline for `dpcheck bench step`: one training step of a ReLU MLP in float32 with TF32 off
(forward, MSE loss, backward, SGD step), timed with CUDA events after a warm-up; prints one JSON line
with the median step time. The model, data and optimizer match what dpcheck's CUDA trainer runs."""
import argparse
import json
import statistics

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dims", required=True, help="layer widths, input first, e.g. 784,256,10")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dims = [int(d) for d in args.dims.split(",")]
    layers = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(torch.nn.ReLU())
    device = torch.device("cuda")
    model = torch.nn.Sequential(*layers).to(device)
    x = torch.rand(args.batch, dims[0], device=device) * 2 - 1
    y = torch.rand(args.batch, dims[-1], device=device) * 2 - 1
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(args.repeats):
        start.record()
        step()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    print(json.dumps({"dims": dims, "batch": args.batch, "median_ms": statistics.median(times),
                      "torch": torch.__version__, "device": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
