"""Save a PyTorch training run as a halfstep training-run file (the way back).

    /usr/bin/python3 examples/torch/to_halfstep.py checkpoint.pt run.safetensors \\
        --optimizer AdamW --schedule cosine:warmup=20,total=400

``checkpoint.pt`` is what a PyTorch loop saves with
``torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
"scheduler": scheduler.state_dict(), "scaler": scaler.state_dict()}, path)``
(``scheduler`` and ``scaler`` optional; a DDP model's ``module.`` prefix is
dropped). The scheduler must be a ``LambdaLR`` running one of halfstep's
schedules, named by ``--schedule`` (``cosine`` or ``linear``, with
``warmup``, ``total`` and ``min`` as ``cosineSchedule`` takes them), since a
lambda cannot be saved; the schedule given must give the learning rate the
checkpoint holds at its step, or the file is refused. halfstep resumes the
file with ``loadTrainingState`` into the same model, ``AdamW`` / ``Adam`` /
``SGD``, ``LrScheduler`` and ``AmpTrainer``. A run that stops in the middle
of one of its steps cannot be saved this way: save after
``optimizer.step()``. Options halfstep's optimizers lack (``amsgrad``,
``maximize``, ``dampening``) are refused. The checkpoint is read without
running code from it (``torch_file.py``: a pickled call, ``os.system``, is
refused in one line before it runs). ``OUT`` must not be there already
(``--overwrite`` replaces it) nor be the checkpoint, and its folder must
take a new file: checked before the checkpoint is read. Bad input is one line on stderr
and exit status 1 (a file) or 2 (a flag).

In a training script, ``halfstep_run.write_run`` does the same from the live
objects (``continue_ddp.py --save`` uses it).
"""

import sys

import torch

from halfstep_run import (ArgumentParser, RunFileError, UsageError, check_output, exit_in_one_line, parse_schedule,
                          refuse_unsupported, say_written, schedule_factor, write_run)
from torch_file import load_state_dicts



def check_schedule(text, schedule, scheduler):
    """UsageError unless ``schedule`` gives the learning rates the scheduler holds at its step."""
    if not {"last_epoch", "base_lrs", "_last_lr"} <= scheduler.keys():
        raise RunFileError("the checkpoint's 'scheduler' is not a LambdaLR's state dict "
                           "(last_epoch, base_lrs, _last_lr)")
    step, factor = scheduler["last_epoch"], schedule_factor(schedule)
    for i, (base, lr) in enumerate(zip(scheduler["base_lrs"], scheduler["_last_lr"])):
        want = base * factor(step)
        if abs(want - lr) > 1e-6 * max(abs(lr), 1e-12):
            raise UsageError(f"--schedule {text}: at the checkpoint's step {step} it gives lr {want:.6g} "
                             f"(group {i}), the checkpoint's is {lr:.6g}; name the schedule it ran")


def read_checkpoint(path):
    """The checkpoint dict, or RunFileError in one line."""
    checkpoint = load_state_dicts(path)  # never runs code from the file
    if not isinstance(checkpoint, dict) or "model" not in checkpoint or "optimizer" not in checkpoint:
        raise RunFileError(f"{path}: not a dict with 'model' and 'optimizer' state dicts")
    model, optimizer = checkpoint["model"], checkpoint["optimizer"]
    if not isinstance(model, dict) or not all(torch.is_tensor(v) for v in model.values()):
        raise RunFileError(f"{path}: its 'model' is not a state dict (model.state_dict(): names to tensors)")
    if not isinstance(optimizer, dict) or not {"state", "param_groups"} <= optimizer.keys():
        raise RunFileError(f"{path}: its 'optimizer' is not an optimizer.state_dict() (state, param_groups)")
    for key in ("scheduler", "scaler"):
        if checkpoint.get(key) is not None and not isinstance(checkpoint[key], dict):
            raise RunFileError(f"{path}: its '{key}' is not a state dict")
    return checkpoint


def main():
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a torch.save()d dict of state dicts")
    parser.add_argument("out", help="the halfstep training-run file to write")
    parser.add_argument("--optimizer", required=True, choices=["AdamW", "Adam", "SGD"],
                        help="the optimizer's class (a state dict does not say)")
    parser.add_argument("--schedule", help="the LambdaLR's schedule, e.g. cosine:warmup=20,total=400")
    parser.add_argument("--overwrite", action="store_true", help="replace a file already at OUT")
    args = parser.parse_args()
    try:
        check_output("OUT", args.out, args.overwrite, [("CHECKPOINT", args.checkpoint)])
        schedule = parse_schedule(args.schedule) if args.schedule else None
        checkpoint = read_checkpoint(args.checkpoint)
        refuse_unsupported(checkpoint["optimizer"].get("param_groups", []))
        scheduler = checkpoint.get("scheduler")
        if scheduler is not None and not schedule:
            raise UsageError("the checkpoint has a scheduler: name its schedule with --schedule")
        if scheduler is not None:
            check_schedule(args.schedule, schedule, scheduler)
        model = {k.removeprefix("module."): v for k, v in checkpoint["model"].items()}
        steps = write_run(args.out, model, dict(checkpoint["optimizer"], kind=args.optimizer), scheduler,
                          schedule, checkpoint.get("scaler") or None)
        say_written("to_halfstep", args.out, f"a halfstep training run at step {steps}, {args.optimizer}; "
                    "loadTrainingState resumes it")
    except (RunFileError, OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        exit_in_one_line("to_halfstep", e, args.checkpoint, "converted")


if __name__ == "__main__":
    main()
