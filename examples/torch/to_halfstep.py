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
lambda cannot be saved. halfstep resumes the file with ``loadTrainingState``
into the same model, ``AdamW`` / ``Adam`` / ``SGD``, ``LrScheduler`` and
``AmpTrainer``. A run that stops in the middle of one of its steps cannot be
saved this way: save after ``optimizer.step()``.

In a training script, ``halfstep_run.write_run`` does the same from the live
objects (``continue_ddp.py --save`` uses it).
"""

import argparse

import torch

from halfstep_run import write_run


def parse_schedule(text):
    """"cosine:warmup=20,total=400,min=0" as halfstep's schedule description."""
    name, _, options = text.partition(":")
    values = dict(item.split("=") for item in options.split(",") if item)
    unknown = set(values) - {"warmup", "total", "min"}
    if name not in ("cosine", "linear") or unknown or "total" not in values:
        raise SystemExit(f"--schedule {text!r}: expected cosine|linear:warmup=W,total=T[,min=F]")
    return {"name": name, "warmup_steps": int(values.get("warmup", 0)),
            "total_steps": int(values["total"]), "min_factor": float(values.get("min", 0))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a torch.save()d dict of state dicts")
    parser.add_argument("out", help="the halfstep training-run file to write")
    parser.add_argument("--optimizer", required=True, choices=["AdamW", "Adam", "SGD"],
                        help="the optimizer's class (a state dict does not say)")
    parser.add_argument("--schedule", help="the LambdaLR's schedule, e.g. cosine:warmup=20,total=400")
    args = parser.parse_args()
    checkpoint = torch.load(args.checkpoint, map_location="cpu")
    model = {k.removeprefix("module."): v for k, v in checkpoint["model"].items()}
    scheduler = checkpoint.get("scheduler")
    if scheduler is not None and not args.schedule:
        parser.error("the checkpoint has a scheduler: name its schedule with --schedule")
    write_run(
        args.out,
        model,
        dict(checkpoint["optimizer"], kind=args.optimizer),
        scheduler,
        parse_schedule(args.schedule) if args.schedule else None,
        checkpoint.get("scaler") or None,
    )


if __name__ == "__main__":
    main()
