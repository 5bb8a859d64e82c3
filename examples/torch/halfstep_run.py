"""Read and write halfstep training-run files with PyTorch and NumPy only.

A halfstep training run (``saveTrainingState``) is one safetensors file laid
out as PyTorch's checkpoint dict, flattened:

- tensor ``model.<key>``                   is ``checkpoint["model"][key]``
- tensor ``optimizer.state.<i>.<key>``     is ``checkpoint["optimizer"]["state"][i][key]``
  (``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``)
- tensor ``grad.<name>``                   a gradient summed so far (saved mid-accumulation)
- metadata ``optimizer`` (JSON)            the rest of ``optimizer.state_dict()``: per-parameter
  ``step``, ``param_groups`` with PyTorch's keys; plus ``kind`` ("AdamW", "Adam", "SGD")
- metadata ``scaler`` (JSON)               ``GradScaler.state_dict()``
- metadata ``scheduler`` (JSON)            ``LambdaLR.state_dict()``; ``halfstep.schedule`` says
  which schedule (``cosine`` or ``linear`` after a linear warmup)
- metadata ``trainer``, ``grads``, ``random``, ``extra``, ``format``: halfstep's own
  (``trainer.dtype``, "f16" or "bf16", is the AMP dtype; absent, as :func:`write_run`
  leaves it, it is not checked)

Fields PyTorch's objects do not have sit under a ``halfstep`` key of their
object. :func:`read_run` returns the checkpoint dict with tensors put back in
place; :func:`write_run` flattens one. The ``safetensors`` package is not
needed: the format is an 8-byte header length, a JSON header, and the raw
little-endian bytes.
"""

import json
import math
import os

import numpy as np
import torch

FORMAT = "halfstep-training-state-3"

_NUMPY = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64}
_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.int32: "I32", torch.bfloat16: "BF16"}


def read_safetensors(path):
    """Returns ({name: tensor}, {metadata key: string}) of a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    length = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + length])
    metadata = header.pop("__metadata__", {}) or {}
    data = memoryview(blob)[8 + length :]
    tensors = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        raw = data[start:end]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            t = torch.from_numpy(bits.view(np.float32).copy()).to(torch.bfloat16)
        else:
            t = torch.from_numpy(np.frombuffer(raw, dtype=_NUMPY[info["dtype"]]).copy())
        tensors[name] = t.reshape(info["shape"])
    return tensors, metadata


def write_safetensors(path, tensors, metadata):
    """Writes {name: tensor} and string metadata atomically (a temporary file, then a rename).

    int64 tensors (``num_batches_tracked``) are written as int32, the integer type halfstep has.
    """
    header, chunks, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.int64:
            t = t.to(torch.int32)
        if t.dtype not in _NAMES:
            raise ValueError(f"write_safetensors: {name} is {t.dtype}; halfstep reads f32, f16, bf16, i32")
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for raw in chunks:
            f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def read_run(path):
    """A halfstep training-run file as a checkpoint dict.

    Keys: ``model`` (a state dict), ``optimizer`` (an ``optimizer.state_dict()``
    with ``kind``), ``scheduler``, ``scaler``, ``trainer`` (None when not saved),
    ``grads`` ({parameter name: gradient}), ``random``, ``extra``.
    """
    tensors, metadata = read_safetensors(path)
    if metadata.get("format") != FORMAT:
        raise ValueError(
            f"{path}: format {metadata.get('format')!r}, not {FORMAT!r}; "
            "load and save it again with the current halfstep"
        )
    parsed = {key: json.loads(metadata[key]) if key in metadata else None for key in
              ("optimizer", "scheduler", "scaler", "trainer", "random", "extra")}
    run = dict(parsed, model={}, grads={})
    optimizer = run["optimizer"]
    if optimizer is not None:
        optimizer["state"] = {int(i): s for i, s in optimizer["state"].items()}
        for s in optimizer["state"].values():
            if "step" in s:  # torch 1.13 keeps Adam's step as a float tensor
                s["step"] = torch.tensor(float(s["step"]))
        for g in optimizer["param_groups"]:
            if "betas" in g:
                g["betas"] = tuple(g["betas"])
    for name, t in tensors.items():
        part, _, rest = name.partition(".")
        if part == "model":
            run["model"][rest] = t
        elif part == "grad":
            run["grads"][rest] = t
        elif part == "optimizer" and rest.startswith("state."):
            _, i, key = rest.split(".", 2)
            optimizer["state"].setdefault(int(i), {})[key] = t
        else:
            raise ValueError(f"{path}: unknown tensor {name!r}")
    return run


def optimizer_kind(optimizer):
    """"AdamW", "Adam" or "SGD": the name halfstep's file gives the optimizer."""
    kind = type(optimizer).__name__
    if kind not in ("AdamW", "Adam", "SGD"):
        raise ValueError(f"halfstep has no {kind}; use AdamW, Adam or SGD")
    return kind


def write_run(path, model, optimizer, scheduler=None, schedule=None, scaler=None, extra=None):
    """Saves a PyTorch run as a halfstep training-run file that ``loadTrainingState`` resumes.

    ``model``, ``optimizer``, ``scheduler`` (a ``LambdaLR``) and ``scaler`` are
    the live objects, or their state dicts (``optimizer`` then a dict with a
    ``kind``); ``schedule`` describes the scheduler's lambda as halfstep's
    ``{"name", "warmup_steps", "total_steps", "min_factor"}``.
    """
    model_sd = model if isinstance(model, dict) else model.state_dict()
    optimizer_sd = optimizer if isinstance(optimizer, dict) else dict(
        optimizer.state_dict(), kind=optimizer_kind(optimizer))
    tensors = {f"model.{k}": v for k, v in model_sd.items()}
    state = {}
    for i, s in optimizer_sd["state"].items():
        state[str(i)] = {}
        for key, v in s.items():
            if key == "step":
                state[str(i)][key] = int(v.item() if torch.is_tensor(v) else v)
            elif torch.is_tensor(v):
                tensors[f"optimizer.state.{i}.{key}"] = v
            else:
                state[str(i)][key] = v
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()}
              for g in optimizer_sd["param_groups"]]
    kind = optimizer_sd["kind"]
    metadata = {
        "format": FORMAT,
        "optimizer": json.dumps({
            "kind": kind, "state": state, "param_groups": groups,
            "halfstep": {} if kind == "SGD" else {"bias_correction": True},
        }),
        "grads": "[]",
        "random": "[]",
        "extra": json.dumps(extra),
    }
    steps = None
    if scheduler is not None:
        sd = dict(scheduler if isinstance(scheduler, dict) else scheduler.state_dict())
        sd["lr_lambdas"] = [None] * len(sd["base_lrs"])
        sd["halfstep"] = {"schedule": schedule} if schedule else {}
        metadata["scheduler"] = json.dumps(sd)
        steps = sd["last_epoch"]
    # No scaler is PyTorch's disabled one ({}): an f32 run for halfstep's AmpTrainer.
    metadata["scaler"] = json.dumps((scaler if isinstance(scaler, dict) else scaler.state_dict()) if scaler else {})
    if steps is None:
        steps = max([s["step"] for s in state.values() if "step" in s], default=0)
    metadata["trainer"] = json.dumps({"micro_step": 0, "steps": steps})
    write_safetensors(path, tensors, metadata)


def schedule_factor(schedule):
    """halfstep's ``cosineSchedule`` / ``linearWarmupDecay`` as a ``LambdaLR`` lambda."""
    name, warmup = schedule["name"], schedule["warmup_steps"]
    total, floor = schedule["total_steps"], schedule["min_factor"]

    def factor(step):
        if step < warmup:
            return step / warmup
        if step >= total:
            return floor
        progress = (step - warmup) / (total - warmup)
        if name == "cosine":
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        return floor + (1 - floor) * (1 - progress)

    if name not in ("cosine", "linear"):
        raise ValueError(f"unknown halfstep schedule {name!r}")
    return factor


def make_optimizer(params, saved):
    """The torch.optim optimizer ``saved`` (a file's ``optimizer``) describes, with its state loaded."""
    kind = saved["kind"]
    if saved.get("halfstep", {}).get("bias_correction", True) is not True:
        raise ValueError("this run's Adam has no bias correction, which torch.optim lacks")
    cls = {"AdamW": torch.optim.AdamW, "Adam": torch.optim.Adam, "SGD": torch.optim.SGD}[kind]
    optimizer = cls(params, lr=saved["param_groups"][0]["lr"])
    optimizer.load_state_dict({"state": saved["state"], "param_groups": saved["param_groups"]})
    return optimizer


def make_scheduler(optimizer, saved):
    """A ``LambdaLR`` that goes on from ``saved`` (a file's ``scheduler``) with the same learning rates."""
    factor = schedule_factor(saved["halfstep"]["schedule"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    scheduler.load_state_dict({k: v for k, v in saved.items() if k != "halfstep"})
    for group, base in zip(optimizer.param_groups, scheduler.base_lrs):
        group["initial_lr"] = base
        group["lr"] = base * factor(scheduler.last_epoch)
    return scheduler


class CpuGradScaler:
    """``torch.cuda.amp.GradScaler``'s semantics and ``state_dict`` on the CPU.

    torch 1.13's GradScaler is CUDA-only (it disables itself elsewhere), so a
    run continued on CPUs carries the scale with this small twin: skip the step
    on inf/NaN gradients and back off; grow after ``growth_interval`` clean steps.
    """

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.scale_value, self.growth_factor = float(init_scale), growth_factor
        self.backoff_factor, self.growth_interval = backoff_factor, growth_interval
        self.growth_tracker, self._found_inf = 0, False

    def scale(self, loss):
        return loss * self.scale_value

    def unscale_(self, optimizer):
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        for g in grads:
            g.div_(self.scale_value)
        self._found_inf = not all(torch.isfinite(g).all() for g in grads)

    def step(self, optimizer):
        self.unscale_(optimizer)
        if not self._found_inf:
            optimizer.step()

    def update(self):
        if self._found_inf:
            self.scale_value *= self.backoff_factor
            self.growth_tracker = 0
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                self.scale_value *= self.growth_factor
                self.growth_tracker = 0

    def get_scale(self):
        return self.scale_value

    def state_dict(self):
        return {"scale": self.scale_value, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "_growth_tracker": self.growth_tracker}

    def load_state_dict(self, state):
        self.scale_value, self.growth_tracker = float(state["scale"]), int(state["_growth_tracker"])
        self.growth_factor, self.backoff_factor = state["growth_factor"], state["backoff_factor"]
        self.growth_interval = int(state["growth_interval"])


def make_scaler(saved, device):
    """The GradScaler ``saved`` (a file's ``scaler``) describes: PyTorch's on CUDA, :class:`CpuGradScaler` else."""
    if "scale" not in saved:
        return None  # saved disabled: an f32 run
    core = {k: v for k, v in saved.items() if k != "halfstep"}
    extras = saved.get("halfstep", {})
    if extras.get("hysteresis", 1) != 1 or extras.get("loss_scale", 0) != 0:
        raise ValueError("this run's scaler uses hysteresis or a static scale, which GradScaler lacks")
    scaler = torch.cuda.amp.GradScaler() if device.type == "cuda" else CpuGradScaler()
    scaler.load_state_dict(core)
    return scaler
