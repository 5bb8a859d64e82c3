"""Read and write halfstep training-run files with PyTorch and NumPy only.

A halfstep training run (``saveTrainingState``) is one safetensors file laid
out as PyTorch's checkpoint dict, flattened:

- tensor ``model.<key>``                   is ``checkpoint["model"][key]``
- tensor ``optimizer.state.<i>.<key>``     is ``checkpoint["optimizer"]["state"][i][key]``
  (``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``); a run with 8-bit or bf16 AdamW
  states (``stateDtype``) holds them dequantized to f32, a plain ``torch.optim.AdamW``
  state, and their exact form under ``optimizer.compact.<i>.<key>``, which
  :func:`read_run` leaves out (``run["compact_states"]`` says which it was)
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
needed (``safetensors_file.py`` reads and writes the format, verifying and
writing halfstep's checksums). A file that cannot be used raises
:class:`RunFileError`, whose message is one line.
"""

import argparse
import json
import math
import os
import sys
import tempfile

import torch

from safetensors_file import RunFileError, read_safetensors, write_safetensors  # noqa: F401 (re-exported)

FORMAT = "halfstep-training-state-3"


class UsageError(ValueError):
    """A bad command-line flag of the scripts here (exit status 2); the message is one line."""


def read_run(path):
    """A halfstep training-run file as a checkpoint dict.

    Keys: ``model`` (a state dict), ``optimizer`` (an ``optimizer.state_dict()``
    with ``kind``), ``scheduler``, ``scaler``, ``trainer`` (None when not saved),
    ``grads`` ({parameter name: gradient}), ``random``, ``extra``,
    ``compact_states`` ("8bit" or "bf16" when the run kept compact AdamW moments,
    read here dequantized; else None).
    """
    tensors, metadata = read_safetensors(path)
    if metadata.get("format") != FORMAT:
        raise RunFileError(
            f"{path}: format {metadata.get('format')!r}, not {FORMAT!r} (not a halfstep training "
            "run, or an older one: load and save it again with the current halfstep)"
        )
    try:
        parsed = {key: json.loads(metadata[key]) if key in metadata else None for key in
                  ("optimizer", "scheduler", "scaler", "trainer", "random", "extra")}
    except (ValueError, TypeError):
        raise RunFileError(f"{path}: its metadata is not valid JSON") from None
    run = dict(parsed, model={}, grads={})
    optimizer = run["optimizer"]
    run["compact_states"] = ((optimizer or {}).get("halfstep") or {}).get("state_dtype")
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
        elif part == "optimizer" and rest.startswith("compact.") and run["compact_states"]:
            pass  # halfstep's exact 8-bit / bf16 moments; PyTorch reads the dequantized ones
        else:
            raise RunFileError(f"{path}: unknown tensor {name!r}")
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
    ``{"name", "warmup_steps", "total_steps", "min_factor"}``. Returns the
    run's step count.
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
    return steps


def _same_file(a, b):
    """Whether ``a`` and ``b`` name one file (the same inode where both exist, else the same path)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_output(flag, path, overwrite, inputs=()):
    """The one rule for a file a tool writes, checked before any work (examples/runs/outputs.ts in
    the Deno examples): UsageError unless it can be written (not a folder, in a folder that exists
    and takes a new file), is none of ``inputs`` (``(flag, path)`` pairs; never allowed) and, when
    a file is there, ``overwrite`` is given. ``flag`` names it in messages ("--save", or "OUT")."""
    where = f"{flag} {path}"
    if os.path.isdir(path):
        raise UsageError(f"{where}: it is a folder; give a file name")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"{where}: the folder {folder} does not exist; create it first")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".halfstep-write-check-")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise UsageError(f"{where}: the folder {folder} cannot be written ({e.strerror or e})") from None
    for name, read in inputs:
        if _same_file(path, read):
            raise UsageError(f"{where} is the file of {name}, which this run reads: writing it would "
                             "replace it; give another path")
    if os.path.lexists(path) and not overwrite:
        raise UsageError(f"{where} already exists; add --overwrite to replace it, or give another path")


def say_written(tool, path, what):
    """The line that says what a tool wrote: ``tool: wrote PATH (what)``."""
    print(f"{tool}: wrote {path} ({what})", flush=True)


def exit_in_one_line(tool, error, subject, cannot):
    """Ends a tool on bad input with one line: what a check said (exit 2 for a flag, 1 for a file),
    or, for an error the checks missed, which input and the error's first line (exit 1)."""
    if isinstance(error, (RunFileError, UsageError, OSError)):
        print(f"{tool}: {error}", file=sys.stderr)
        sys.exit(2 if isinstance(error, UsageError) else 1)
    detail = str(error).splitlines()[0][:200] if str(error) else "no detail"
    print(f"{tool}: {subject}: cannot be {cannot} ({type(error).__name__}: {detail})", file=sys.stderr)
    sys.exit(1)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line (``script: problem (see --help)``), exit status 2."""

    def error(self, message):
        print(f"{self.prog.removesuffix('.py')}: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def parse_schedule(text):
    """"cosine:warmup=20,total=400,min=0" as halfstep's schedule description (UsageError if not)."""
    name, _, options = text.partition(":")
    try:
        values = dict(item.split("=") for item in options.split(",") if item)
        unknown = set(values) - {"warmup", "total", "min"}
        assert name in ("cosine", "linear") and not unknown and "total" in values
        return {"name": name, "warmup_steps": int(values.get("warmup", 0)),
                "total_steps": int(values["total"]), "min_factor": float(values.get("min", 0))}
    except (ValueError, AssertionError):
        raise UsageError(f"--schedule {text!r}: expected cosine|linear:warmup=W,total=T[,min=F]") from None


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


def refuse_unsupported(param_groups):
    """Raises RunFileError for options halfstep's optimizers do not implement (amsgrad, maximize, dampening)."""
    for i, group in enumerate(param_groups):
        for key in ("amsgrad", "maximize", "dampening"):
            if group.get(key):
                raise RunFileError(
                    f"optimizer group {i} has {key}={group[key]!r}, which halfstep's optimizers do not "
                    "implement; train without it")


def make_optimizer(params, saved):
    """The torch.optim optimizer ``saved`` (a file's ``optimizer``) describes, with its state loaded."""
    refuse_unsupported(saved["param_groups"])
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
