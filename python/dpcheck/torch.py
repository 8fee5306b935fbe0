"""dpcheck.torch: a PyTorch data-parallel job's promises, checked from inside the job.

    monitor = dpcheck.torch.Monitor(model, optimizer, sampler=sampler, loss="mse", gradient_every=10)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            monitor.step(x, y)          # after the optimizer's step, before the next zero_grad
    monitor.close()

After every step the replicas are compared bit for bit: the parameters, the optimizer's state and
hyperparameters, and the buffers as the step's forward pass saw them (after DDP's broadcast), each hashed
with XXH3 in dpcheck's C++ core and the hashes all-gathered (the gradients the optimizer used are hashed
too once a difference is found, to place it). A difference is
located to the tensor and element, with every rank's value, the ranks in the minority and the distance in
ULPs, and placed: in this step's gradient, in this step's update, or outside the update (a buffer, a
parameter changed on one rank between steps). Every epoch's shares of the sampler are gathered and held
to disjointness and cover; DistributedSampler's padding is reported as padding (a failure with
strict_shares=True), and a shuffle that repeats the previous epoch's order is a failure. At the chosen
steps every rank's batch is gathered and the all-reduced gradient is held against the float64 gradient of
the whole batch within dpcheck's derived bound, for an nn.Sequential of Linear layers with ReLU, Tanh or
no activation between them and an mse or cross-entropy loss; the report gives the error ratio, the
closest call and the weight each rank's examples carry. Any other model is "not judged", with the
reason, never passed.

A failed check raises CheckFailed on every rank at once (the verdict is collective, so no rank is left
waiting in a collective) and rank 0 prints the report. docs/torch.md is the manual.
"""

import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

from dpcheck import _core

__all__ = ["Monitor", "CheckFailed", "model_family", "optimizer_spec", "hash_tensor", "NOT_JUDGED"]

NOT_JUDGED = "not judged"


class CheckFailed(RuntimeError):
    """A promise broken at `step`: `kind` is "replicas", "sampler" or "gradient"; `report` the text
    rank 0 printed; `details` what the check measured."""

    def __init__(self, kind: str, step: int, report: str, details: Optional[Dict[str, Any]] = None):
        super().__init__(report)
        self.kind = kind
        self.step = step
        self.report = report
        self.details = details or {}


# ---- tensors as bytes ------------------------------------------------------------------------------

def _as_array(t: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a contiguous NumPy array, shared with the tensor where it can be."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy()


def hash_tensor(t: torch.Tensor, seed: int = 0) -> int:
    """XXH3-64 of a tensor's bytes, in dpcheck's C++ core."""
    return _core.hash(_as_array(t), seed)


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


# ---- the model family the gradient check covers ------------------------------------------------------

_ACTIVATIONS = {torch.nn.ReLU: "relu", torch.nn.Tanh: "tanh", torch.nn.Identity: "identity"}


def model_family(module: torch.nn.Module) -> Tuple[Optional[Dict[str, Any]], str]:
    """(description, "") when dpcheck's reference covers the module: an nn.Sequential of Linear layers,
    each with a bias and float32 parameters, with one kind of activation (ReLU, Tanh or Identity)
    between consecutive layers and none after the last; else (None, the reason)."""
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        module = module.module
    if not isinstance(module, torch.nn.Sequential):
        return None, f"the model is a {type(module).__name__}, not an nn.Sequential of Linear layers"
    children = list(module.named_children())
    linears: List[Tuple[str, torch.nn.Linear]] = []
    activation = None
    expect_linear = True
    for name, child in children:
        if isinstance(child, torch.nn.Linear):
            if not expect_linear:
                return None, f"layers {linears[-1][0]} and {name} are Linear with no activation between them"
            if child.bias is None:
                return None, f"Linear layer {name} has no bias (dpcheck's reference model has one in every layer)"
            if child.weight.dtype != torch.float32 or child.bias.dtype != torch.float32:
                return None, f"Linear layer {name} holds {child.weight.dtype}, not torch.float32"
            linears.append((name, child))
            expect_linear = False
        elif type(child) in _ACTIVATIONS:
            if expect_linear:
                return None, f"module {name} ({type(child).__name__}) does not follow a Linear layer"
            kind = _ACTIVATIONS[type(child)]
            if activation is not None and activation != kind:
                return None, f"the activations differ ({activation} and {kind}); the reference takes one kind"
            activation = kind
            expect_linear = True
        else:
            return None, f"module {name} is a {type(child).__name__}; the reference covers Linear, ReLU, Tanh, Identity"
    if not linears:
        return None, "the model has no Linear layer"
    if expect_linear:
        return None, "the model ends in an activation, after its last Linear layer"
    for (_, a), (name, b) in zip(linears, linears[1:]):
        if a.out_features != b.in_features:
            return None, f"layer {name} takes {b.in_features} inputs where the layer before gives {a.out_features}"
    dims = [linears[0][1].in_features] + [l.out_features for _, l in linears]
    names = [n for n, _ in linears]
    return {"dims": dims, "activation": activation or "identity", "linears": [l for _, l in linears],
            "names": names}, ""


def _loss_name(loss: Any) -> Tuple[Optional[str], str]:
    if loss is None:
        return None, "no loss named (Monitor(loss='mse' or 'cross_entropy'))"
    if isinstance(loss, str):
        key = loss.replace("-", "_").lower()
        if key in ("mse", "cross_entropy"):
            return key, ""
        return None, f"loss {loss!r}: the reference takes 'mse' or 'cross_entropy'"
    if isinstance(loss, torch.nn.MSELoss):
        if loss.reduction != "mean":
            return None, f"MSELoss(reduction={loss.reduction!r}): the reference's mse is the mean"
        return "mse", ""
    if isinstance(loss, torch.nn.CrossEntropyLoss):
        if loss.reduction != "mean" or loss.weight is not None or getattr(loss, "label_smoothing", 0.0) != 0.0:
            return None, "CrossEntropyLoss with class weights, label smoothing or a reduction other than the mean"
        return "cross_entropy", ""
    return None, f"loss {type(loss).__name__}: the reference takes mse or cross-entropy"


def optimizer_spec(optimizer: Any) -> Dict[str, Any]:
    """The optimizer as dpcheck's reference knows it, for records and bundles: {"name", "kind" ("sgd",
    "momentum" or "adam"), "lr", "momentum" | "beta1", "beta2", "eps"}, or {"name", "kind": None,
    "not_judged": the reason}."""
    name = type(optimizer).__name__ if optimizer is not None else "no optimizer"

    def no(reason: str) -> Dict[str, Any]:
        return {"name": name, "kind": None, "not_judged": reason}

    if optimizer is None:
        return no("no optimizer was given to the Monitor")
    if len(optimizer.param_groups) != 1:
        return no(f"{name} has {len(optimizer.param_groups)} param groups; the reference takes one")
    g = optimizer.param_groups[0]
    if g.get("maximize", False):
        return no(f"{name}(maximize=True)")
    if g.get("weight_decay", 0) != 0:
        return no(f"{name} with weight decay; the reference has none")
    if type(optimizer) is torch.optim.SGD:
        if g.get("nesterov", False) or g.get("dampening", 0) != 0:
            return no("SGD with Nesterov momentum or dampening; the reference has plain momentum")
        if g.get("momentum", 0) == 0:
            return {"name": name, "kind": "sgd", "lr": float(g["lr"])}
        return {"name": name, "kind": "momentum", "lr": float(g["lr"]), "momentum": float(g["momentum"])}
    if type(optimizer) is torch.optim.Adam:
        if g.get("amsgrad", False):
            return no("Adam(amsgrad=True)")
        b1, b2 = g["betas"]
        return {"name": name, "kind": "adam", "lr": float(g["lr"]), "beta1": float(b1), "beta2": float(b2),
                "eps": float(g["eps"])}
    return no(f"torch.optim.{name}: the reference has SGD, SGD with momentum and Adam")


def _counted(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


# ---- the monitor -------------------------------------------------------------------------------------

def _record_sampler(sampler: Any, monitor: "Monitor") -> None:
    cls = type(sampler)
    if getattr(cls, "_dpcheck_recording", False):
        raise ValueError("the sampler is already recorded by another Monitor")

    def __iter__(self):  # noqa: N807
        indices = [int(i) for i in cls.__iter__(self)]
        monitor.record_indices(indices)
        return iter(indices)

    recording = type(cls.__name__, (cls,), {"__iter__": __iter__, "_dpcheck_recording": True})
    try:
        sampler.__class__ = recording
    except TypeError as e:
        raise ValueError(f"the sampler ({cls.__name__}) cannot be recorded ({e}); call monitor.record_indices "
                         "with each epoch's indices instead") from e


class Monitor:
    """Checks a data-parallel job's promises after each optimizer step (see the module's text).

    model: the module trained (a DistributedDataParallel or the module itself); optimizer: its optimizer
    (None: no optimizer state to compare). sampler or loader: the sampler whose every pass is an epoch
    (a loader's sampler is taken); dataset_size: the data set's size where the sampler has no
    `dataset`. loss: "mse", "cross_entropy" or the loss module, for the gradient check; gradient_every:
    check the gradient at every K-th step (0: never); gradient_steps: and at these steps (counted from 0).
    strict_shares: padding and dropped examples fail. shuffled: whether the sampler shuffles (default:
    its `shuffle` attribute, else judged from the order). group: the process group (default: the world).
    out: where rank 0 prints (default sys.stderr). raise_on_failure: False keeps going and collects the
    failures in `failures`. trace: a new file for dpcheck's trace. record: a new directory where rank 0
    records every step (parameters, optimizer state, the global batch, the gradient used, the state after)
    for `dpcheck drift`; bundle_dir: an existing directory where rank 0 leaves a repro bundle of a step
    that fails a check, for `dpcheck replay`. Both need a model the gradient check covers, and the batch
    of every step (step(x, y) or micro_batch).
    """

    def __init__(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, *,
                 sampler: Any = None, loader: Any = None, dataset_size: Optional[int] = None,
                 loss: Any = None, gradient_every: int = 0, gradient_steps: Sequence[int] = (),
                 strict_shares: bool = False, shuffled: Optional[bool] = None, group: Any = None,
                 out: Any = None, raise_on_failure: bool = True, trace: Optional[str] = None,
                 record: Optional[str] = None, bundle_dir: Optional[str] = None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model: a torch.nn.Module, not {type(model).__name__}")
        if gradient_every < 0:
            raise ValueError(f"gradient_every={gradient_every}: give 0 (never) or a positive number of steps")
        if sampler is not None and loader is not None:
            raise ValueError("give sampler or loader, not both")
        self.model = model
        self.inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
        self.optimizer = optimizer
        self.group = group
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(group) if self.distributed else 0
        self.world = dist.get_world_size(group) if self.distributed else 1
        self.out = out if out is not None else sys.stderr
        self.raise_on_failure = raise_on_failure
        self.failures: List[CheckFailed] = []
        self._hyper_labels: Dict[str, Tuple[str, List[str]]] = {}
        self.step_index = 0
        self.checked_steps = 0
        self.gradient_every = gradient_every
        self.gradient_steps = set(int(s) for s in gradient_steps)
        self.gradient_ratios: List[float] = []
        self.family, self.family_reason = model_family(self.inner)
        self.loss, loss_reason = _loss_name(loss)
        if self.family is not None and self.loss is None:
            self.family, self.family_reason = None, loss_reason
        self._not_judged_said = False
        self.param_names = [n for n, _ in self.inner.named_parameters()]
        self._param_of = {id(p): n for n, p in self.inner.named_parameters()}
        # The state the step's forward pass started from, taken by a pre-forward hook.
        self._pre: Optional[Dict[str, Any]] = None
        self._last_params_hash: Optional[int] = None
        self._micro: List[Tuple[np.ndarray, np.ndarray]] = []
        # The trace (dpcheck's format, divergence/trace.hpp): rank 0 alone writes it, to a new file.
        self.trace_path = trace
        self._trace_file = None
        self._batch_digest: Optional[Tuple[int, int]] = None
        if trace is not None:
            # Rank 0 makes the file and says to every rank whether it could, so that all refuse alike and
            # none is left waiting in a collective.
            def make_trace() -> str:
                try:
                    self._trace_file = open(trace, "x")
                except FileExistsError:
                    return f"trace {trace}: the file exists (a trace is never overwritten)"
                except OSError as e:
                    return f"trace {trace}: {e.strerror}"
                return ""
            self._refuse_alike(make_trace() if self.rank == 0 else "")
        # Records and bundles (python/torch_record.hpp): rank 0 writes them, and keeps its state from before
        # each step for them.
        self.record_path = record
        self.bundle_dir = bundle_dir
        self.bundles: List[str] = []
        self._keep = record is not None or bundle_dir is not None
        self._gathered: Optional[List[Any]] = None
        if self._keep:
            self._open_records()
        self._hook = self.inner.register_forward_pre_hook(self._pre_forward)
        # The sampler's epochs: recorded passes waiting to be judged, and the last judged one.
        if loader is not None:
            sampler = getattr(loader, "sampler", None)
            batch_sampler = getattr(loader, "batch_sampler", None)
            if batch_sampler is not None and hasattr(batch_sampler, "sampler"):
                sampler = batch_sampler.sampler
        self.sampler = sampler
        self.strict_shares = strict_shares
        self.shuffled = shuffled if shuffled is not None else getattr(sampler, "shuffle", None)
        self.dataset_size = dataset_size
        if self.dataset_size is None and sampler is not None and hasattr(sampler, "dataset"):
            self.dataset_size = len(sampler.dataset)
        self._pending_epochs: List[np.ndarray] = []
        self._previous_shares: Optional[List[np.ndarray]] = None
        self.epochs_judged = 0
        self.share_notes: List[str] = []
        if sampler is not None:
            if self.dataset_size is None:
                raise ValueError("the sampler has no `dataset`: give dataset_size")
            _record_sampler(sampler, self)

    # ---- what the user calls --------------------------------------------------------------------------

    def record_indices(self, indices: Sequence[int]) -> None:
        """One epoch's indices of this rank, for a sampler the monitor does not record itself."""
        if self.dataset_size is None:
            raise ValueError("give Monitor(dataset_size=...) to record indices")
        self._pending_epochs.append(np.asarray(list(indices), dtype=np.int64))

    def micro_batch(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One micro-batch this rank trained on in this step (for the gradient check and the trace)."""
        if self.trace_path is not None:
            count, digest = self._batch_digest or (0, 0)
            self._batch_digest = (count + int(x.shape[0]), _core.hash(_as_array(x), digest))
        if self._gradient_due() or self._keep:
            self._micro.append((_as_array(x.float()).reshape(x.shape[0], -1).copy(), _as_array(y).copy()))

    def step(self, x: Optional[torch.Tensor] = None, y: Optional[torch.Tensor] = None,
             loss: Optional[Any] = None) -> None:
        """After the optimizer's step: checks the replicas, any epoch the sampler finished, and, at the
        chosen steps, the gradient. x and y: this step's batch on this rank (or give each micro-batch to
        micro_batch() before). loss: this rank's loss of the step, for the trace."""
        if x is not None:
            if y is None:
                raise ValueError("give the batch's targets with its inputs: step(x, y)")
            self.micro_batch(x, y)
        failures: List[CheckFailed] = []
        header = self._replica_header()
        gathered = self._all_gather_int64(header["vector"])
        failure = self._judge_replicas(header, gathered)
        if failure is not None:
            failures.append(failure)
        pending = min(int(row[3]) for row in gathered)
        for _ in range(pending):
            f = self._judge_epoch(self._pending_epochs.pop(0))
            if f is not None:
                failures.append(f)
        if self._gradient_due() and failure is not None:
            if self.rank == 0:
                print(f"dpcheck.torch: step {self.step_index}'s gradient {NOT_JUDGED}: the replicas differ",
                      file=self.out, flush=True)
        elif self._gradient_due():
            f = self._judge_gradient()
            if f is not None:
                failures.append(f)
        if self.trace_path is not None:
            self._trace_step(header, loss)
        if self.record_path is not None:
            self._write_step(self.record_path, failures[0] if failures else None)
        if failures and self.bundle_dir is not None:
            self._write_bundle(failures[0])
        self._gathered = None
        self._micro = []
        self._batch_digest = None
        self._pre = None
        self._last_params_hash = header["params_hash"]
        self.step_index += 1
        self.checked_steps += 1
        self._fail_all(failures)

    def close(self) -> None:
        """Judges an epoch recorded after the last step, removes the hook, and prints the summary."""
        if self.distributed:
            counts = self._all_gather_int64([len(self._pending_epochs)])
            pending = min(int(c[0]) for c in counts)
        else:
            pending = len(self._pending_epochs)
        failures = []
        for _ in range(pending):
            f = self._judge_epoch(self._pending_epochs.pop(0))
            if f is not None:
                failures.append(f)
        self._hook.remove()
        if self._trace_file is not None:
            self._trace_file.close()
            self._trace_file = None
        if self.rank == 0:
            print(self.summary(), file=self.out, flush=True)
        self._fail_all(failures)

    def summary(self) -> str:
        head = f"dpcheck.torch: {_counted(self.checked_steps, 'step')} on {_counted(self.world, 'rank')}: "
        parts = [head + ("replicas bitwise identical after every step"
                         if not any(f.kind == "replicas" for f in self.failures) else "replicas differed")]
        if self.sampler is not None or self.epochs_judged:
            parts.append(f"{_counted(self.epochs_judged, 'epoch')} of shares judged")
        if self.gradient_ratios:
            parts.append(f"{_counted(len(self.gradient_ratios), 'gradient check')}, largest error ratio "
                         f"{max(self.gradient_ratios):.3g}")
        elif self.family is None and (self.gradient_every or self.gradient_steps):
            parts.append(f"gradient {NOT_JUDGED}: {self.family_reason}")
        if self.failures:
            parts.append(_counted(len(self.failures), "failed check"))
        return "; ".join(parts)

    # ---- replicas ------------------------------------------------------------------------------------

    def _pre_forward(self, module, inputs):
        if self._pre is not None:
            return  # a later micro-batch of the same step
        params = [p for _, p in self.inner.named_parameters()]
        buffers = list(self.inner.named_buffers())
        param_hashes, params_hash = _core.hash_all([_as_array(p) for p in params])
        buffer_arrays = [_as_array(b).copy() for _, b in buffers]
        buffer_hashes, buffers_hash = _core.hash_all(buffer_arrays)
        self._pre = {"params_hash": params_hash, "param_hashes": param_hashes,
                     "buffers": [(n, _dtype_name(b), list(b.shape), a) for (n, b), a in zip(buffers, buffer_arrays)],
                     "buffer_hashes": buffer_hashes, "buffers_hash": buffers_hash}
        if (self._gradient_due() or (self._keep and self.rank == 0)) and self.family is not None:
            flat = []
            for layer in self.family["linears"]:
                flat.append(layer.weight.detach().reshape(-1))
                flat.append(layer.bias.detach().reshape(-1))
            self._pre["flat_params"] = torch.cat(flat).to(torch.float32).cpu().numpy().copy()
            if self._keep and self.rank == 0:
                self._pre["flat_state"], self._pre["optimizer_steps"] = self._flat_state()
                self._pre["lr"] = float(self.optimizer.param_groups[0]["lr"]) if self.optimizer is not None else 0.0

    def _tensors(self) -> List[Tuple[str, str, torch.Tensor]]:
        """(section, name, tensor) for everything compared after the step, in the order reported."""
        out: List[Tuple[str, str, torch.Tensor]] = []
        named = list(self.inner.named_parameters())
        for n, p in named:
            if p.grad is not None:
                out.append(("gradient", n + ".grad", p.grad))
        if self.optimizer is not None:
            for g, group in enumerate(self.optimizer.param_groups):
                hyper = []
                keys = []
                labels = []  # each element's key, so that a difference is named "lr", not by its position
                for k in sorted(k for k in group if k != "params"):
                    v = group[k]
                    if isinstance(v, (bool, int, float)):
                        keys.append(k)
                        hyper.append(float(v))
                        labels.append(k)
                    elif isinstance(v, (tuple, list)) and all(isinstance(e, (int, float)) for e in v):
                        keys.append(k)
                        hyper.extend(float(e) for e in v)
                        labels.extend(f"{k}[{i}]" for i in range(len(v)))
                name = f"param_groups[{g}] ({', '.join(keys)})"
                self._hyper_labels[name] = (f"param_groups[{g}]", labels)
                out.append(("hyperparameters", name, torch.tensor(hyper, dtype=torch.float64)))
                for p in group["params"]:
                    state = self.optimizer.state.get(p, {})
                    pname = self._param_of.get(id(p), f"param_groups[{g}] parameter")
                    for k in sorted(state):
                        v = state[k]
                        if v is None:  # SGD's momentum_buffer without momentum
                            continue
                        t = v if isinstance(v, torch.Tensor) else torch.tensor([float(v)], dtype=torch.float64)
                        out.append(("optimizer state", f"{k} of {pname}", t))
        for n, p in named:
            out.append(("parameters", n, p))
        return out

    def _replica_header(self) -> Dict[str, Any]:
        tensors = self._tensors()
        # The replicas' promise is their parameters, buffers and optimizer state: those are hashed every step.
        # The gradients only place a difference once one is found (the optimizer was given different
        # gradients), so they are hashed then (_judge_replicas), while they are still there: a quarter less
        # to read every step.
        kept = [i for i, (section, _, _) in enumerate(tensors) if section != "gradient"]
        kept_hashes, combined = _core.hash_all([_as_array(tensors[i][2]) for i in kept])
        hashes: List[Optional[int]] = [None] * len(tensors)
        for i, h in zip(kept, kept_hashes):
            hashes[i] = h
        # The parameters' combined hash as hash_all makes it (the pre-forward hook's), from their own hashes
        # above rather than a second pass over them.
        param_hashes = [h for (section, _, _), h in zip(tensors, hashes) if section == "parameters"]
        params_hash = _core.hash(np.asarray(param_hashes + [len(param_hashes)], dtype=np.uint64))
        pre = self._pre
        outside = 0
        if pre is not None and self._last_params_hash is not None and pre["params_hash"] != self._last_params_hash:
            outside = 1
        structure = _core.hash(np.frombuffer("\n".join(f"{s}|{n}|{_dtype_name(t)}|{tuple(t.shape)}"
                                                       for s, n, t in tensors).encode(), dtype=np.uint8))
        vector = [combined, len(tensors), outside, len(self._pending_epochs),
                  pre["params_hash"] if pre else 0, pre["buffers_hash"] if pre else 0, self.step_index, structure]
        return {"vector": [_signed(v) for v in vector], "tensors": tensors, "hashes": hashes,
                "params_hash": params_hash}

    def _judge_replicas(self, header: Dict[str, Any], gathered: List[List[int]]) -> Optional[CheckFailed]:
        step = self.step_index
        first = gathered[0]
        # A change outside the step that every rank made alike (row[2]) breaks nothing: only differences do.
        if all(row[0] == first[0] and row[4] == first[4] and row[5] == first[5] and row[6] == first[6]
               and row[7] == first[7] for row in gathered):
            return None
        lines = []
        steps = [row[6] for row in gathered]
        if len(set(steps)) > 1:
            lines.append("the ranks are at different steps: " +
                         ", ".join(f"rank {r} at step {s}" for r, s in enumerate(steps)) +
                         " (a rank called monitor.step() more or fewer times)")
            return self._failure("replicas", step, lines)
        outside = [r for r, row in enumerate(gathered) if row[2]]
        # Every rank's list of tensors and hashes (the gradients' hashed now), then the first tensor that
        # differs, gathered whole.
        hashes = header["hashes"]
        unhashed = [i for i, h in enumerate(hashes) if h is None]
        for i, h in zip(unhashed, _core.hash_all([_as_array(header["tensors"][i][2]) for i in unhashed])[0]):
            hashes[i] = h
        mine = [(s, n, _dtype_name(t), list(t.shape), h) for (s, n, t), h in zip(header["tensors"], hashes)]
        pre = self._pre
        pre_buffers = [(n, d, s, h) for (n, d, s, _), h in zip(pre["buffers"], pre["buffer_hashes"])] if pre else []
        everyone = self._all_gather_object((mine, pre_buffers))
        where = None
        if outside:
            where = ("outside the step: the parameters of " + _ranks_text(outside) +
                     f" changed between the end of step {step - 1} and the start of step {step}'s forward pass "
                     "(code outside the optimizer's step changed them: a rank-dependent branch?)")
        elif len(set(row[4] for row in gathered)) > 1:
            where = (f"before step {step}'s forward pass: the parameters already differed when the step began "
                     "(the replicas did not start from the same parameters: no broadcast at the start?)")
        # Buffers as the forward pass saw them.
        buffer_diff = None
        if len(set(row[5] for row in gathered)) > 1 and pre is not None:
            for i, (name, dtype, shape, _) in enumerate(pre_buffers):
                if len(set(rows[1][i][3] if i < len(rows[1]) else None for rows in everyone)) > 1:
                    arrays = self._all_gather_object(pre["buffers"][i][3])
                    buffer_diff = (name, dtype, shape, arrays)
                    break
        by_section: Dict[str, List[int]] = {}
        structure_differs = len(set(row[7] for row in gathered)) > 1
        if structure_differs:
            names = [[(s, n) for s, n, _, _, _ in rows[0]] for rows in everyone]
            lines.append("the ranks hold different tensors after the step (" +
                         "; ".join(f"rank {r}: {len(ns)}" for r, ns in enumerate(names)) +
                         " tensors): optimizer state missing or extra on some rank?")
            first_diff = next((i for i in range(min(len(ns) for ns in names))
                               if len(set(ns[i] for ns in names)) > 1), None)
            if first_diff is not None:
                lines.append("  first: " + ", ".join(f"rank {r} {ns[first_diff][0]} {ns[first_diff][1]}"
                                                     for r, ns in enumerate(names)))
            return self._failure("replicas", step, [f"replicas differ after step {step}: " + lines[0]] + lines[1:])
        for i, (section, name, dtype, shape, _) in enumerate(mine):
            if len(set(rows[0][i][4] for rows in everyone)) > 1:
                by_section.setdefault(section, []).append(i)
        order = ["gradient", "hyperparameters", "optimizer state", "parameters"]
        located = None
        if buffer_diff is not None:
            name, dtype, shape, arrays = buffer_diff
            located = ("buffer", name, dtype, shape, arrays)
            if where is None:
                where = (f"outside the update: buffer {name} differed at the start of step {step}'s forward pass "
                         "(buffers change in the forward pass, not in the optimizer's step; DDP makes them equal "
                         "at each forward only with broadcast_buffers=True)")
        else:
            for section in order:
                if section in by_section:
                    i = by_section[section][0]
                    tensor = header["tensors"][i][2]
                    arrays = self._all_gather_object(_as_array(tensor).copy())
                    located = (section, mine[i][1], mine[i][2], mine[i][3], arrays)
                    break
        if where is None and located is not None:
            section = located[0]
            if section == "gradient":
                where = (f"in step {step}'s gradient: the ranks' optimizers were given different gradients "
                         "(the all-reduce did not give every rank the same average)")
            elif section == "hyperparameters":
                where = f"in the optimizer's hyperparameters: they differ across ranks at step {step}"
            elif section == "optimizer state":
                where = (f"in the optimizer's state at step {step}: the gradients were the same on every rank, so "
                         "the difference was carried into the step by the state (restored on some ranks only?)")
            else:
                where = (f"in step {step}'s update: the ranks started the step from the same parameters with the "
                         "same gradients and optimizer state, and ended it with different parameters")
        lines.append(f"replicas differ after step {step} ({len(gathered)} ranks, XXH3 of every tensor): " + where)
        if located is not None:
            section, name, dtype, shape, arrays = located
            diff = _core.locate(dtype, arrays, shape)
            if diff["differs"]:
                element = f"{name}{diff['index']}"
                if section == "hyperparameters" and name in self._hyper_labels:
                    group, labels = self._hyper_labels[name]
                    at = int(diff["index"].strip("[]"))
                    element = f"{group}[\"{labels[at]}\"]" if 0 <= at < len(labels) else element
                lines.append(f"  first difference: {section} {element} ({diff['differing']} of "
                             f"{int(np.prod(shape)) if shape else 1} elements differ)")
                for r, text in enumerate(diff["texts"]):
                    lines.append(f"  rank {r}: {text}" + ("  <- minority" if r in diff["minority"] else ""))
                unit = f" {diff['unit']}" if diff["unit"] else ""
                lines.append(f"  ranks in the minority: {', '.join(map(str, diff['minority']))}; largest distance "
                             f"from the majority value: {diff['distance']}{unit}")
        counts = [f"{len(v)} {k}" for k, v in ((s, by_section.get(s, [])) for s in order) if v]
        if counts:
            lines.append("  tensors that differ after the step: " + ", ".join(counts))
        return self._failure("replicas", step, lines)

    # ---- the sampler -----------------------------------------------------------------------------------

    def _judge_epoch(self, mine: np.ndarray) -> Optional[CheckFailed]:
        epoch = self.epochs_judged
        shares = self._all_gather_object(mine)
        v = _core.judge_epoch(epoch, int(self.dataset_size), shares, self._previous_shares, self.shuffled,
                              self.strict_shares)
        self._previous_shares = shares
        self.epochs_judged += 1
        if v["passed"]:
            if v["padded"] or v["dropped"]:
                self.share_notes.append(v["message"])
                if self.rank == 0:
                    print("dpcheck.torch: sampler, " + v["message"], file=self.out, flush=True)
            return None
        return self._failure("sampler", self.step_index, ["sampler shares: " + v["message"]], v)

    # ---- the gradient -----------------------------------------------------------------------------------

    def _gradient_due(self) -> bool:
        s = self.step_index
        return (self.gradient_every > 0 and s % self.gradient_every == 0) or s in self.gradient_steps

    def _judge_gradient(self) -> Optional[CheckFailed]:
        step = self.step_index
        if self.family is None:
            if not self._not_judged_said and self.rank == 0:
                print(f"dpcheck.torch: gradient {NOT_JUDGED}: {self.family_reason}", file=self.out, flush=True)
            self._not_judged_said = True
            return None
        pre = self._pre
        if pre is None or "flat_params" not in pre:
            reason = "the model's forward pass did not run in this step (no parameters seen at its start)"
        elif not self._micro:
            reason = "no batch recorded on this rank (call monitor.step(x, y) or monitor.micro_batch(x, y))"
        else:
            reason = ""
        problems = self._all_gather_object(reason)
        problem = next((f"rank {r}: {p}" for r, p in enumerate(problems) if p), "")
        if problem:
            if self.rank == 0:
                print(f"dpcheck.torch: step {step}'s gradient {NOT_JUDGED}: {problem}", file=self.out, flush=True)
            return None
        grads = []
        for layer in self.family["linears"]:
            for p in (layer.weight, layer.bias):
                grads.append(p.grad.detach().reshape(-1) if p.grad is not None else torch.zeros(p.numel(), device=p.device))
        gradient = torch.cat(grads).to(torch.float32).cpu().numpy()
        batches = self._gathered_batches()
        verdict = None
        if self.rank == 0:
            parts = [part for rank_parts in batches for part in rank_parts]
            try:
                verdict = _core.judge_gradient(self.family["dims"], self.family["activation"],
                                               self.loss.replace("_", "-"),
                                               pre["flat_params"], parts, gradient, self.world)
                verdict["message"] = self._torch_names(verdict["message"])
                verdict["element"] = self._torch_names(verdict["element"])
            except ValueError as e:
                verdict = {"passed": None, "message": f"step {step}'s gradient {NOT_JUDGED}: {e}"}
        verdict = self._broadcast_object(verdict)
        if verdict["passed"] is None:
            if self.rank == 0:
                print("dpcheck.torch: " + verdict["message"], file=self.out, flush=True)
            return None
        self.gradient_ratios.append(verdict["ratio"])
        if verdict["passed"]:
            return None
        lines = [f"gradient at step {step}: " + verdict["message"],
                 f"  bound there: {verdict['bound_terms']}"]
        return self._failure("gradient", step, lines, verdict)

    def _torch_names(self, text: str) -> str:
        """dpcheck's layer names (layers.1.weight) as the Sequential's own (2.weight)."""
        for k in range(len(self.family["names"]) - 1, -1, -1):
            name = self.family["names"][k]
            text = text.replace(f"layers.{k}.weight", f"{name}.weight").replace(f"layers.{k}.bias", f"{name}.bias")
        return text

    # ---- the trace -----------------------------------------------------------------------------------------

    def _trace_step(self, header: Dict[str, Any], loss: Any) -> None:
        """One line of dpcheck's trace format for this step: every rank's part gathered to rank 0, which
        writes it (after the header, at the first step). A part holds the batch (its example count, and the
        XXH3 of its inputs where dpcheck's own traces digest example indices), the gradient the optimizer
        used, the parameters and each optimizer state block, per tensor. Before the all-reduce is not
        seen: the local gradient is left empty ("not reached" to dpcheck diff)."""
        names = [n for n, _ in self.inner.named_parameters()]
        params = dict(self.inner.named_parameters())

        def summary(t: Optional[torch.Tensor]) -> Dict[str, Any]:
            a = np.zeros(0, dtype=np.float32) if t is None else _as_array(t.detach().to(torch.float32))
            return _core.summarize(np.ascontiguousarray(a.reshape(-1)))

        blocks: Dict[str, Dict[str, torch.Tensor]] = {}
        if self.optimizer is not None:
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    for k, v in self.optimizer.state.get(p, {}).items():
                        if isinstance(v, torch.Tensor) and v.shape == p.shape:
                            blocks.setdefault(k, {})[self._param_of.get(id(p), "")] = v
        state_names = sorted(blocks)
        count, digest = self._batch_digest or (0, 0)
        loss_value = None
        if loss is not None:
            loss_value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
        part = {"rank": self.rank, "indices": {"count": count, "digest": f"{digest & ((1 << 64) - 1):016x}"},
                "local_grad": [], "reduced_grad": [summary(params[n].grad) for n in names],
                "params": [summary(params[n]) for n in names],
                "state": [[summary(blocks[k].get(n)) for n in names] for k in state_names],
                "loss": loss_value, "examples": count, "state_names": state_names}
        parts = self._gather_object_to_zero(part)
        if self.rank != 0:
            return
        if self._trace_file.tell() == 0:
            family = self.family or {}
            head = {"dpcheck_trace": 1, "dpcheck_version": _core.version,
                    "config": {"source": "dpcheck.torch", "model": type(self.inner).__name__,
                               "dims": family.get("dims"), "activation": family.get("activation"),
                               "optimizer": type(self.optimizer).__name__ if self.optimizer is not None else None,
                               "data_digest": "the inputs of each rank's batch"},
                    "target": {"engine": "torch " + torch.__version__,
                               "comm": dist.get_backend(self.group) if self.distributed else "none"},
                    "world_size": self.world, "digest": "xxh3", "tensors": names, "state": state_names}
            self._trace_file.write(json.dumps(head) + "\n")
        losses = [(p["loss"], p["examples"]) for p in parts]
        line_loss = None
        if all(l is not None for l, _ in losses):
            total = sum(n for _, n in losses)
            line_loss = sum(l * n for l, n in losses) / total if total else sum(l for l, _ in losses) / len(losses)
        ranks = []
        for p in parts:
            blocks_of = dict(zip(p["state_names"], p["state"]))
            ranks.append({"rank": p["rank"], "indices": p["indices"], "local_grad": [],
                          "reduced_grad": p["reduced_grad"], "params": p["params"],
                          "state": [blocks_of.get(k, [summary(None)] * len(names)) for k in state_names]})
        self._trace_file.write(json.dumps({"step": self.step_index, "loss": line_loss, "ranks": ranks,
                                           "collectives": []}) + "\n")
        self._trace_file.flush()

    # ---- records and bundles (python/torch_record.hpp) ----------------------------------------------------

    def _open_records(self) -> None:
        """Refuses, on every rank alike, what cannot be recorded; makes the record's directory (rank 0)."""
        what = "record" if self.record_path is not None else "bundle_dir"
        if self.family is None:
            raise ValueError(f"{what}: a record needs a model the gradient check covers, and a loss: "
                             f"{self.family_reason}")

        def make_record() -> str:
            if self.bundle_dir is not None and not os.path.isdir(self.bundle_dir):
                return f"bundle_dir {self.bundle_dir}: not a directory"
            if self.record_path is None:
                return ""
            try:
                os.mkdir(self.record_path)
                self._write_json(os.path.join(self.record_path, "record.json"), self._record_header(None))
            except FileExistsError:
                return f"record {self.record_path}: it exists (a record is never written over)"
            except OSError as e:
                return f"record {self.record_path}: {e.strerror}"
            return ""
        self._refuse_alike(make_record() if self.rank == 0 else "")

    def _refuse_alike(self, refusal: str) -> None:
        """Rank 0's refusal (or "") raised as a ValueError on every rank, so that all refuse alike and none
        is left waiting in a collective."""
        refusal = self._broadcast_object(refusal)
        if refusal:
            raise ValueError(refusal)

    def _record_header(self, failure: Optional[CheckFailed]) -> Dict[str, Any]:
        head = {"dpcheck_torch_record": 1, "dpcheck_version": _core.version, "torch": torch.__version__,
                "backend": dist.get_backend(self.group) if self.distributed else "none", "world_size": self.world,
                "model": {"dims": self.family["dims"], "activation": self.family["activation"],
                          "loss": self.loss.replace("_", "-"), "names": self.family["names"]},
                "optimizer": optimizer_spec(self.optimizer), "command_line": list(sys.argv)}
        if failure is not None:
            head["failure"] = {"kind": failure.kind, "step": failure.step, "message": failure.report}
        return head

    @staticmethod
    def _write_json(path: str, obj: Any) -> None:
        with open(path, "x") as f:
            f.write(json.dumps(obj, indent=1) + "\n")

    def _flat_state(self) -> Tuple[np.ndarray, int]:
        """The optimizer's state in dpcheck's layout (block after block, each the Linear layers' weights and
        biases in order), and its step count, for the optimizers the reference knows."""
        spec = optimizer_spec(self.optimizer)
        kind = spec["kind"]
        blocks = {"momentum": ["momentum_buffer"], "adam": ["exp_avg", "exp_avg_sq"]}.get(kind, [])
        params = [p for layer in self.family["linears"] for p in (layer.weight, layer.bias)]
        out = []
        steps = 0
        for name in blocks:
            for p in params:
                v = self.optimizer.state.get(p, {}).get(name)
                out.append(torch.zeros(p.numel()) if v is None else v.detach().reshape(-1).to(torch.float32).cpu())
        if kind == "adam":
            v = self.optimizer.state.get(params[0], {}).get("step")
            steps = int(float(v)) if v is not None else 0
        elif kind == "momentum":
            # The reference starts the buffer from the gradient when no step came before.
            steps = max(1, self.step_index) if self.optimizer.state.get(params[0], {}).get("momentum_buffer") is not None else 0
        flat = torch.cat(out).numpy().copy() if out else np.zeros(0, dtype=np.float32)
        return flat, steps

    def _gathered_batches(self) -> List[Any]:
        """Every rank's micro-batches of this step on rank 0 (once a step: the gradient check, the record and
        the bundle share them)."""
        if self._gathered is None:
            self._gathered = self._gather_object_to_zero([(self.rank, x, y) for x, y in self._micro])
        return self._gathered

    def _write_step(self, parent: str, failure: Optional[CheckFailed]) -> Optional[str]:
        """This step into parent/step-NNNNNNNN (rank 0), built under a temporary name and renamed into
        place. Every rank calls it (the batches are gathered); returns why the step is not written, or None."""
        pre = self._pre
        missing = "" if self._micro else "no batch on this rank (give monitor.step(x, y) or micro_batch)"
        problems = self._all_gather_object(missing)
        problem = next((f"rank {r}: {p}" for r, p in enumerate(problems) if p), "")
        batches = self._gathered_batches() if not problem else []
        if self.rank != 0:
            return problem or None
        if not problem and (pre is None or "flat_params" not in pre):
            problem = "the model's forward pass did not run in this step"
        if problem:
            print(f"dpcheck.torch: step {self.step_index} not recorded: {problem}", file=self.out, flush=True)
            return problem
        parts = [part for rank_parts in batches for part in rank_parts]
        name = f"step-{self.step_index:08d}"
        tmp = os.path.join(parent, f".{name}.tmp-{os.getpid()}")
        os.mkdir(tmp)
        xs = np.concatenate([x.reshape(x.shape[0], -1).astype(np.float32) for _, x, _ in parts])
        if self.loss == "mse":
            ys = np.concatenate([y.reshape(y.shape[0], -1).astype(np.float32) for _, _, y in parts])
        else:
            ys = np.concatenate([y.reshape(-1).astype(np.int64) for _, _, y in parts])
        grads = [p.grad.detach().reshape(-1) if p.grad is not None else torch.zeros(p.numel())
                 for layer in self.family["linears"] for p in (layer.weight, layer.bias)]
        after = [p.detach().reshape(-1) for layer in self.family["linears"] for p in (layer.weight, layer.bias)]
        state_after, _ = self._flat_state()
        arrays = {"params": pre["flat_params"], "state": pre["flat_state"], "x": xs, "y": ys,
                  "grad": torch.cat(grads).to(torch.float32).cpu().numpy(),
                  "params_after": torch.cat(after).to(torch.float32).cpu().numpy(), "state_after": state_after}
        for key, a in arrays.items():
            np.save(os.path.join(tmp, key + ".npy"), np.ascontiguousarray(a))
        step = {"step": self.step_index, "lr": pre["lr"], "optimizer_steps": pre["optimizer_steps"],
                "parts": [{"rank": r, "examples": int(x.shape[0])} for r, x, _ in parts]}
        if failure is not None:
            step["failure"] = {"kind": failure.kind, "message": failure.report}
        self._write_json(os.path.join(tmp, "step.json"), step)
        os.rename(tmp, os.path.join(parent, name))
        return None

    def _write_bundle(self, failure: CheckFailed) -> None:
        """A repro bundle of this failed step in bundle_dir (rank 0): the record of this one step, with the
        failure in its record.json. Never replaces one: -2, -3, ... are added."""
        base = os.path.join(self.bundle_dir, f"dpcheck-bundle-step-{self.step_index:08d}")
        path, k = base, 2
        while os.path.lexists(path):
            path, k = f"{base}-{k}", k + 1
        tmp = os.path.join(self.bundle_dir, f".{os.path.basename(path)}.tmp-{os.getpid()}")
        made = ""
        try:
            if self.rank == 0:
                os.mkdir(tmp)
                self._write_json(os.path.join(tmp, "record.json"), self._record_header(failure))
            problem = self._write_step(tmp, failure)
            if self.rank == 0:
                if problem:
                    made = f"no repro bundle: step {self.step_index} {problem}"
                else:
                    os.rename(tmp, path)
                    made = path
        except OSError as e:
            made = f"no repro bundle ({path}: {e.strerror})"
        if self.rank == 0:
            if made == path:
                self.bundles.append(path)
                print(f"dpcheck.torch: repro bundle {path}; replay it with: dpcheck replay {path}", file=self.out, flush=True)
            else:
                print(f"dpcheck.torch: {made}", file=self.out, flush=True)

    # ---- collectives -------------------------------------------------------------------------------------

    def _all_gather_int64(self, values: List[int]) -> List[List[int]]:
        t = torch.tensor(values, dtype=torch.int64)
        if not self.distributed:
            return [t.tolist()]
        out = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(out, t, group=self.group)
        return [o.tolist() for o in out]

    def _all_gather_object(self, obj: Any) -> List[Any]:
        if not self.distributed:
            return [obj]
        out: List[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def _gather_object_to_zero(self, obj: Any) -> List[Any]:
        if not self.distributed:
            return [obj]
        out: Optional[List[Any]] = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.group)
        return out or []

    def _broadcast_object(self, obj: Any) -> Any:
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    # ---- verdicts -----------------------------------------------------------------------------------------

    def _failure(self, kind: str, step: int, lines: List[str], details: Optional[Dict[str, Any]] = None) -> CheckFailed:
        return CheckFailed(kind, step, "dpcheck.torch: FAILED " + "\n".join(lines), details)

    def _fail_all(self, failures: List[CheckFailed]) -> None:
        """Every rank holds the same failures: rank 0 prints them, and every rank raises the first with
        the whole report."""
        if not failures:
            return
        self.failures.extend(failures)
        report = "\n".join(f.report for f in failures)
        if self.rank == 0:
            print(report, file=self.out, flush=True)
        if self.raise_on_failure:
            first = failures[0]
            raise CheckFailed(first.kind, first.step, report, first.details)


def _signed(v: int) -> int:
    """A 64-bit hash as the signed integer an int64 tensor holds."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _ranks_text(ranks: Sequence[int]) -> str:
    ranks = list(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"
