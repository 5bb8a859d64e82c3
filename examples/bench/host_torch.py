# PyTorch eager's host time per training step on its `meta` device: the dispatcher, autograd,
# clip_grad_norm_ and torch.optim.AdamW run, no kernel computes. The reference rows of
# `bench host` (examples/bench/host.ts), which drives this script over stdin so that its steps
# interleave with halfstep's: each line "MODEL MODE" runs one step of that model (made on the
# first line that names it) and answers one JSON line with its milliseconds. MODE is f32, or
# ckpt (f32 with torch.utils.checkpoint): AMP's GradScaler and autocast need CUDA, so PyTorch's
# AMP rows are its f32 step. Models: mlp, cnn, tiny_gpt, nanogpt, gpt2 (sizes below, as
# halfstep's bench builds them).
import json, math, sys, time
import torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

GPTS = {  # vocab, context, layers, dim, heads, gelu, tied head without bias, batch
    "tiny_gpt": (28, 32, 2, 64, 4, "none", False, 32),
    "nanogpt": (65, 256, 6, 384, 6, "none", False, 2),
    "gpt2": (50257, 256, 12, 96, 12, "tanh", True, 1),  # the 124M's layers at width 96, as halfstep's
}

class Block(nn.Module):
    def __init__(s, c, h, gelu):
        super().__init__()
        s.h, s.gelu = h, gelu
        s.ln1 = nn.LayerNorm(c); s.qkv = nn.Linear(c, 3 * c); s.proj = nn.Linear(c, c)
        s.ln2 = nn.LayerNorm(c); s.fc = nn.Linear(c, 4 * c); s.out = nn.Linear(4 * c, c)
    def forward(s, x):
        b, t, c = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(c, dim=2)
        q, k, v = [z.view(b, t, s.h, c // s.h).transpose(1, 2) for z in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // s.h)
        att = att.masked_fill(s.mask[:t, :t], float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        x = x + s.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + s.out(F.gelu(s.fc(s.ln2(x)), approximate=s.gelu))

class GPT(nn.Module):
    def __init__(s, vocab, context, layers, dim, heads, gelu, tied):
        super().__init__()
        s.tok = nn.Embedding(vocab, dim); s.pos = nn.Embedding(context, dim)
        s.blocks = nn.ModuleList([Block(dim, heads, gelu) for _ in range(layers)])
        s.ln = nn.LayerNorm(dim); s.head = nn.Linear(dim, vocab, bias=not tied)
        if tied: s.head.weight = s.tok.weight
        s.ckpt = False
    def forward(s, idx):
        x = s.tok(idx) + s.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in s.blocks: x = checkpoint(b, x, use_reentrant=False) if s.ckpt else b(x)
        return s.head(s.ln(x))

def make(name):
    dev = "meta"
    if name in GPTS:
        vocab, context, layers, dim, heads, gelu, tied, batch = GPTS[name]
        model = GPT(vocab, context, layers, dim, heads, gelu, tied).to(dev)
        mask = torch.triu(torch.ones(context, context, dtype=torch.bool, device=dev), 1)
        for b in model.blocks: b.mask = mask
        x = torch.zeros((batch, context), dtype=torch.long, device=dev)
        y = torch.zeros(batch * context, dtype=torch.long, device=dev)
        return model, x, y, lambda ckpt: setattr(model, "ckpt", ckpt), lambda x: model(x).view(-1, vocab)
    if name == "mlp":
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        x = torch.zeros((128, 784), device=dev)
    else:
        model = nn.Sequential(nn.Conv2d(1, 32, 3), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(32, 64, 3), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(1600, 10))
        x = torch.zeros((128, 1, 28, 28), device=dev)
    model = model.to(dev)
    y = torch.zeros(128, dtype=torch.long, device=dev)
    state = {"ckpt": False}
    # √n segments, each checkpointed without re-entrance (the input needs no gradient), the last
    # kept, as checkpoint_sequential and halfstep's "auto" do.
    layers = list(model.children())
    size = max(1, len(layers) // max(1, round(math.sqrt(len(layers)))))
    segments = [nn.Sequential(*layers[i:i + size]) for i in range(0, len(layers), size)]
    def forward(x):
        if not state["ckpt"]: return model(x)
        for seg in segments[:-1]: x = checkpoint(seg, x, use_reentrant=False)
        return segments[-1](x)
    return model, x, y, lambda ckpt: state.update(ckpt=ckpt), forward

print(json.dumps({"torch": torch.__version__}), flush=True)
runs = {}
for line in sys.stdin:
    name, mode = line.split()
    try:
        if name not in runs:
            model, x, y, set_ckpt, forward = make(name)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            runs[name] = (model, x, y, set_ckpt, forward, opt)
        model, x, y, set_ckpt, forward, opt = runs[name]
        set_ckpt(mode == "ckpt")
        t0 = time.perf_counter()
        loss = F.cross_entropy(forward(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        print(json.dumps({"ms": (time.perf_counter() - t0) * 1000}), flush=True)
    except Exception as e:
        why = str(e).split("\n")[0][:200]
        if "convolution_backward" in why: why = "PyTorch's meta device has no convolution backward"
        print(json.dumps({"error": why}), flush=True)
