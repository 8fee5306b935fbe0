#!/usr/bin/env python3
"""PyTorch baseline for `dpcheck bench step`: one training step of a ReLU MLP in float32 (forward, MSE
loss, backward, SGD step), timed after a warm-up; prints one JSON line with the median step time. The
model, data shapes and optimizer match what dpcheck's trainer runs.

--device cuda (the default; `bench step --engine cuda`): TF32 off, timed with CUDA events.
--device cpu (`bench step --engine cpu`): timed with time.perf_counter on --threads threads, and the
line names the threads PyTorch used and the BLAS library its products went to, since a CPU ratio means
little without them.

When torch cannot be imported the script says so in one line on stderr and exits with status 3, so
that the caller can report the baseline as skipped rather than failed."""
import argparse
import json
import os
import re
import statistics
import sys
import time

EXIT_NO_TORCH = 3


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", required=True, help="layer widths, input first, e.g. 784,256,10")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--threads", type=int, default=0,
                        help="cpu: intra-op threads for PyTorch and its BLAS (default: PyTorch's own choice)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    if args.repeats < 1 or args.warmup < 0 or args.threads < 0 or args.batch < 1:
        parser.error("--repeats must be at least 1, --batch at least 1, --warmup and --threads at least 0")
    return args


def blas_in_use(torch) -> dict:
    """The BLAS library PyTorch's float32 products run on: a short name, its version where the library or
    its file name gives it, the library file and (OpenBLAS) its threads and the kernel it chose.

    Distribution builds say BLAS_INFO=generic in torch.__config__.show() and link whatever libblas.so.3
    the system points at (Debian: OpenBLAS, BLIS or the reference BLAS), so the library actually mapped
    into this process after a product is the better witness; the build's own BLAS_INFO is the fallback."""
    a = torch.ones(64, 64)
    (a @ a).sum().item()  # loads the BLAS, if it is loaded lazily
    found = {"blas": None, "blas_version": None, "blas_library": None, "blas_threads": None, "blas_core": None}
    mapped = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            mapped = sorted({line.split()[-1] for line in maps if "/" in line})
    except OSError:
        pass
    names = [("libmkl_", "MKL"), ("libopenblas", "OpenBLAS"), ("libblis", "BLIS"), ("libflexiblas", "FlexiBLAS"),
             ("libsatlas", "ATLAS"), ("libtatlas", "ATLAS"), ("/blas/libblas.so", "reference BLAS")]
    for key, name in names:
        hits = [path for path in mapped if key in path]
        if hits:
            found["blas"], found["blas_library"] = name, hits[0]
            version = re.search(r"-r(\d+\.\d+\.\d+)", hits[0])
            if version:
                found["blas_version"] = version.group(1)
            break
    if found["blas"] is None:
        info = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
        short = {"mkl": "MKL", "open": "OpenBLAS", "blis": "BLIS", "accelerate": "Accelerate", "eigen": "Eigen"}
        found["blas"] = short.get(info.group(1), info.group(1)) if info else "unknown"
    if found["blas"] == "OpenBLAS":
        # OpenBLAS picks its kernel from the CPU model it recognizes; on an unrecognized (virtual) CPU
        # it falls back to an old SSE kernel whatever vector units the CPU has, which decides PyTorch's
        # speed more than anything else here. OPENBLAS_CORETYPE overrides the choice.
        import ctypes
        try:
            lib = ctypes.CDLL(found["blas_library"])
            found["blas_threads"] = lib.openblas_get_num_threads()
            lib.openblas_get_corename.restype = ctypes.c_char_p
            found["blas_core"] = lib.openblas_get_corename().decode()
            lib.openblas_get_config.restype = ctypes.c_char_p
            version = re.match(r"OpenBLAS (\S+)", lib.openblas_get_config().decode())
            if version:
                found["blas_version"] = version.group(1)
        except (OSError, AttributeError):
            pass
    return found


def main() -> None:
    args = parse_args()
    if args.device == "cpu" and args.threads > 0:
        # Read once, when the libraries load: PyTorch's set_num_threads reaches OpenMP and MKL but not
        # OpenBLAS's own thread pool, which would otherwise take every core.
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS"):
            os.environ[name] = str(args.threads)
    try:
        import torch
    except ImportError as e:
        print(f"cannot import torch in {sys.executable}: {e}", file=sys.stderr)
        sys.exit(EXIT_NO_TORCH)

    dims = [int(d) for d in args.dims.split(",")]
    layers = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(torch.nn.ReLU())

    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    elif args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
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
    times = []
    line = {"dims": dims, "batch": args.batch, "device": args.device}
    if args.device == "cuda":
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        for _ in range(args.repeats):
            start.record()
            step()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        line["device"] = torch.cuda.get_device_name()
    else:
        # The CPU step is synchronous: the clock around it is the whole step.
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
        line["threads"] = torch.get_num_threads()
        line.update(blas_in_use(torch))
    line.update({"median_ms": statistics.median(times), "warmup": args.warmup, "repeats": args.repeats,
                 "torch": torch.__version__})
    print(json.dumps(line))


if __name__ == "__main__":
    main()
