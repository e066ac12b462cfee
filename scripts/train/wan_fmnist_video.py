#!/usr/bin/env python3
"""A small Wan 2.1-structured video DiT trained on moving Fashion-MNIST items (flow matching).

The data are made here from Debian's dataset-fashion-mnist: each clip is FRAMES frames of a
CANVAS x CANVAS gray canvas on which one item, shrunk to ITEM x ITEM pixels, travels TRAVEL
pixels in a straight line, in one of four directions (MOTIONS). The model is conditioned on
the pair (item class, motion): conditioning row motion * 10 + class of a learned table of text
tokens, row 40 the null condition of classifier-free guidance.

The PyTorch model below computes what dit/models/wan.cpp computes (diffusers
WanTransformer3DModel: 1 x p x p patch embedding, per block self-attention with Q/K RMSNorm
across heads and 3-D RoPE, cross-attention to the text tokens, GELU-tanh FFN, a scale/shift
table plus the timestep projection as modulation, and an output layer modulated by the
timestep embedding), with diffusers' tensor names, so its state_dict is a checkpoint the
cocodiff loader reads (configs/models/wan-fmnist.toml). Pixel space: no VAE.

  prepare  --out data.npz                      the Debian files as arrays (as flux_fmnist.py)
  train    --data data.npz --out DIR           flow-matching training, then the scores below
  classifier --data data.npz --out clf.safetensors   the frame classifier that scores samples
  score    --ckpt DIR/ema.pt --classifier clf.safetensors   class and motion scores of samples
  check    --cocodiff build/apps/cocodiff      PyTorch vs `cocodiff forward` on random weights
  clips    --data data.npz --out clips.pgm     a grid of training clips (to look at the data)

Scores: a small CNN trained on the clips' frames (labels: the item's class) classifies every
frame of generated clips; the motion check takes each frame's centre of brightness and asks
that it moves in the direction asked for.

Only numpy and torch are needed.
"""

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flux_fmnist import (  # noqa: E402  (same folder: the data, file and math helpers)
    CLASSES, apply_rope, cmd_prepare, gelu_tanh, read_safetensors, rope_angles, sigma_schedule,
    timestep_embedding, write_safetensors)

# The shapes of configs/models/wan-fmnist.toml.
CFG = dict(
    heads=6,
    head_dim=16,
    blocks=4,
    mlp_ratio=2.0,
    channels=1,
    patch=4,
    text_tokens=4,
    text_dim=32,
    timestep_dim=64,
    rope_axes=(8, 4, 4),  # Wan's split of head_dim 16: h = w = 2 * (16 // 6), t = the rest
    rope_theta=10000.0,
    num_conditions=40,  # 10 classes x 4 motions; row 40 is the null condition
    eps=1e-6,
)
FRAMES = 8
CANVAS = 24
ITEM = 16
TRAVEL = CANVAS - ITEM  # pixels an item moves from the first frame to the last
MOTIONS = ["right", "left", "down", "up"]


# ---------------------------------------------------------------------------------------------
# The data: moving items
# ---------------------------------------------------------------------------------------------

def shrink(x):
    """[N, 28, 28] uint8 -> [N, ITEM, ITEM] float in [-1, 1] (area average, antialiased)."""
    t = torch.tensor(x, dtype=torch.float32)[:, None] / 127.5 - 1
    return F.interpolate(t, size=(ITEM, ITEM), mode="area")[:, 0]


def trajectories(motion, across):
    """motion [B] (index into MOTIONS), across [B] (the fixed coordinate) -> rows, cols [B, F]:
    the item's top-left corner in every frame."""
    step = torch.round(torch.arange(FRAMES, dtype=torch.float32) * TRAVEL / (FRAMES - 1)).long()
    along = step[None, :].expand(motion.shape[0], FRAMES)
    rev = TRAVEL - along
    fixed = across[:, None].expand(-1, FRAMES)
    m = motion[:, None]
    rows = torch.where(m == 2, along, torch.where(m == 3, rev, fixed))
    cols = torch.where(m == 0, along, torch.where(m == 1, rev, fixed))
    return rows, cols


def make_clips(items, motion, across):
    """items [B, ITEM, ITEM] in [-1, 1] -> clips [B, 1, FRAMES, CANVAS, CANVAS]."""
    b = items.shape[0]
    big = 2 * CANVAS
    pad = torch.full((b, big, big), -1.0, device=items.device)
    pad[:, CANVAS:CANVAS + ITEM, CANVAS:CANVAS + ITEM] = items
    rows, cols = trajectories(motion.cpu(), across.cpu())
    ar = torch.arange(CANVAS)
    r = (CANVAS - rows)[:, :, None] + ar  # [B, F, CANVAS]
    c = (CANVAS - cols)[:, :, None] + ar
    bi = torch.arange(b, device=items.device)[:, None, None, None]
    out = pad[bi, r[:, :, :, None].to(items.device), c[:, :, None, :].to(items.device)]
    return out[:, None]


def random_clips(items, labels, g, n):
    """n clips of random items, motions and positions -> (clips, condition rows, motions)."""
    dev = items.device  # the draws come from g (CPU), the clips are built where the items are
    idx = torch.randint(0, items.shape[0], (n,), generator=g).to(dev)
    motion = torch.randint(0, len(MOTIONS), (n,), generator=g).to(dev)
    across = torch.randint(0, TRAVEL + 1, (n,), generator=g).to(dev)
    it = items[idx]
    flip = (torch.rand(n, generator=g) < 0.5).to(dev)  # mirrored items are still of their class
    it = torch.where(flip[:, None, None], it.flip(-1), it)
    cond = motion * 10 + labels[idx]
    return make_clips(it, motion, across), cond, motion


# ---------------------------------------------------------------------------------------------
# The model (names as diffusers WanTransformer3DModel)
# ---------------------------------------------------------------------------------------------

def layer_norm(x, eps, w=None, b=None):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=eps)


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class RMSWeight(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))


class Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.to_q, self.to_k, self.to_v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.to_out = nn.ModuleList([nn.Linear(d, d)])
        self.norm_q, self.norm_k = RMSWeight(d), RMSWeight(d)

    def forward(self, x, ctx, heads, eps, rope=None):
        b, n, d = x.shape
        q = rms(self.to_q(x), self.norm_q.weight, eps)
        k = rms(self.to_k(ctx), self.norm_k.weight, eps)
        v = self.to_v(ctx)
        q, k, v = (t.view(b, -1, heads, d // heads).transpose(1, 2) for t in (q, k, v))
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if hasattr(F, "scaled_dot_product_attention"):
            o = F.scaled_dot_product_attention(q, k, v)
        else:  # PyTorch < 2.0
            o = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1) @ v
        return self.to_out[0](o.transpose(1, 2).reshape(b, n, d))


class FeedForward(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.net = nn.ModuleList([nn.Module(), nn.Identity(), nn.Linear(f, d)])
        self.net[0].proj = nn.Linear(d, f)

    def forward(self, x):
        return self.net[2](gelu_tanh(self.net[0].proj(x)))


class Block(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.attn1, self.attn2 = Attention(d), Attention(d)
        self.norm2 = nn.LayerNorm(d, eps=CFG["eps"])  # cross_attn_norm: affine
        self.ffn = FeedForward(d, f)
        self.scale_shift_table = nn.Parameter(torch.randn(1, 6, d) / d ** 0.5)

    def forward(self, h, text, tp, heads, eps, rope):
        m = (self.scale_shift_table + tp).chunk(6, dim=1)  # tp [B, 6, D]
        hn = layer_norm(h, eps) * (1 + m[1]) + m[0]
        h = h + self.attn1(hn, hn, heads, eps, rope) * m[2]
        n2 = layer_norm(h, eps, self.norm2.weight, self.norm2.bias)
        h = h + self.attn2(n2, text, heads, eps)
        h = h + self.ffn(layer_norm(h, eps) * (1 + m[4]) + m[3]) * m[5]
        return h


class Mlp(nn.Module):
    def __init__(self, i, d, act):
        super().__init__()
        self.linear_1, self.linear_2, self.act = nn.Linear(i, d), nn.Linear(d, d), act

    def forward(self, x):
        return self.linear_2(self.act(self.linear_1(x)))


class WanFmnist(nn.Module):
    def __init__(self, cfg=CFG):
        super().__init__()
        self.cfg = cfg
        d = cfg["heads"] * cfg["head_dim"]
        f = int(round(d * cfg["mlp_ratio"]))
        p, c = cfg["patch"], cfg["channels"]
        self.patch_embedding = nn.Conv3d(c, d, (1, p, p), stride=(1, p, p))
        self.condition_embedder = nn.Module()
        self.condition_embedder.time_embedder = Mlp(cfg["timestep_dim"], d, F.silu)
        self.condition_embedder.time_proj = nn.Linear(d, 6 * d)
        self.condition_embedder.text_embedder = Mlp(cfg["text_dim"], d, gelu_tanh)
        self.blocks = nn.ModuleList([Block(d, f) for _ in range(cfg["blocks"])])
        self.proj_out = nn.Linear(d, p * p * c)
        self.scale_shift_table = nn.Parameter(torch.randn(1, 2, d) / d ** 0.5)
        self.class_embedding = nn.Module()
        self.class_embedding.text = nn.Embedding(cfg["num_conditions"] + 1,
                                                 cfg["text_tokens"] * cfg["text_dim"])
        self._rope = {}

    def init_for_training(self):
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Conv3d)):
                nn.init.xavier_uniform_(m.weight.view(m.weight.shape[0], -1))
                nn.init.zeros_(m.bias)
        for b in self.blocks:  # every block starts as the identity (adaLN-zero's gates)
            nn.init.zeros_(b.scale_shift_table)
        nn.init.zeros_(self.condition_embedder.time_proj.weight)
        nn.init.zeros_(self.proj_out.weight)
        nn.init.normal_(self.class_embedding.text.weight, std=1.0)

    def rope(self, frames, rows, cols, device, dtype):
        key = (frames, rows, cols, str(device), dtype)
        if key not in self._rope:
            f, r, c = torch.meshgrid(torch.arange(frames), torch.arange(rows), torch.arange(cols),
                                     indexing="ij")
            pos = torch.stack([f.flatten(), r.flatten(), c.flatten()], 1)
            ang = rope_angles(pos, self.cfg["rope_axes"], self.cfg["rope_theta"])
            self._rope[key] = (torch.cos(ang).to(device, dtype), torch.sin(ang).to(device, dtype))
        return self._rope[key]

    def forward(self, video, sigma, text):
        """video [B, C, F, H, W], sigma [B], text [B, Nt, text_dim] -> velocity, video's shape."""
        cfg = self.cfg
        b, c, fr, hh, ww = video.shape
        p, heads, eps = cfg["patch"], cfg["heads"], cfg["eps"]
        h = self.patch_embedding(video)  # [B, D, F, H/p, W/p]
        gf, gh, gw = h.shape[2:]
        h = h.flatten(2).transpose(1, 2)  # [B, n, D], tokens frame-major
        ce = self.condition_embedder
        temb = ce.time_embedder(timestep_embedding(sigma * 1000.0, cfg["timestep_dim"])
                                .to(video.dtype))
        tp = ce.time_proj(F.silu(temb)).view(b, 6, -1)
        txt = ce.text_embedder(text)
        rope = self.rope(gf, gh, gw, video.device, video.dtype)
        for blk in self.blocks:
            h = blk(h, txt, tp, heads, eps, rope)
        shift, scale = (self.scale_shift_table + temb[:, None]).chunk(2, dim=1)
        out = self.proj_out(layer_norm(h, eps) * (1 + scale) + shift)  # [B, n, (py, px, c)]
        out = out.view(b, gf, gh, gw, p, p, c).permute(0, 6, 1, 2, 4, 3, 5)
        return out.reshape(b, c, fr, hh, ww)

    def conditioning(self, rows):
        t = self.class_embedding.text(rows)
        return t.view(-1, self.cfg["text_tokens"], self.cfg["text_dim"])

    def velocity(self, video, sigma, rows):
        return self(video, sigma, self.conditioning(rows))


@torch.no_grad()
def sample(model, rows, steps, cfg_scale, shift, g):
    """Euler sampling from noise (the flow shift as cocodiff's static shift), true CFG."""
    n, dev = rows.shape[0], next(model.parameters()).device
    rows = rows.to(dev)
    x = torch.randn(n, 1, FRAMES, CANVAS, CANVAS, generator=g).to(dev)
    s = [shift * v / (1 + (shift - 1) * v) for v in sigma_schedule(steps)]
    null = torch.full_like(rows, model.cfg["num_conditions"])
    for i in range(steps):
        sig = torch.full((n,), s[i], device=dev)
        v = model.velocity(x, sig, rows)
        if cfg_scale != 1.0:
            vu = model.velocity(x, sig, null)
            v = vu + cfg_scale * (v - vu)
        x = x + (s[i + 1] - s[i]) * v
    return x


# ---------------------------------------------------------------------------------------------
# Scores: the class of every frame, and the direction of motion
# ---------------------------------------------------------------------------------------------

class FrameClassifier(nn.Module):
    """A small CNN on CANVAS x CANVAS frames: the class of the item wherever it is."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool2d(2), nn.Flatten(),
            nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x):
        return self.net(x)


def train_classifier(items, labels, test_items, test_labels, seconds, seed=1):
    clf = FrameClassifier()
    opt = torch.optim.Adam(clf.parameters(), 1e-3)
    g = torch.Generator().manual_seed(seed)
    t0, steps = time.time(), 0
    while time.time() - t0 < seconds:
        clips, cond, _ = random_clips(items, labels, g, 32)
        frame = torch.randint(0, FRAMES, (32,), generator=g)
        x = clips[torch.arange(32), 0, frame][:, None]
        loss = F.cross_entropy(clf(x), cond % 10)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
    clf.eval()
    gt = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        clips, cond, _ = random_clips(test_items, test_labels, gt, 2000)
        frame = torch.randint(0, FRAMES, (2000,), generator=gt)
        x = clips[torch.arange(2000), 0, frame][:, None]
        acc = (clf(x).argmax(1) == cond % 10).float().mean().item()
    return clf, acc, steps


def centres(clips):
    """clips [B, 1, F, H, W] in [-1, 1] -> the centre of brightness (row, col) [B, F, 2]."""
    w = (clips[:, 0].clamp(-1, 1) + 1) / 2
    ar = torch.arange(CANVAS, dtype=w.dtype)
    tot = w.sum((-1, -2)).clamp_min(1e-6)
    return torch.stack([(w.sum(-1) * ar).sum(-1) / tot, (w.sum(-2) * ar).sum(-1) / tot], -1)


def motion_of(clips):
    """The motion index each clip's centre of brightness follows (largest displacement)."""
    d = centres(clips)[:, -1] - centres(clips)[:, 0]  # [B, 2] (rows, cols)
    horiz = d[:, 1].abs() >= d[:, 0].abs()
    return torch.where(horiz, torch.where(d[:, 1] > 0, 0, 1), torch.where(d[:, 0] > 0, 2, 3))


def score(model, clf, per_condition, steps, cfg_scale, shift, seed):
    rows = torch.arange(40).repeat_interleave(per_condition)
    g = torch.Generator().manual_seed(seed)
    clips = torch.cat([sample(model, r, steps, cfg_scale, shift, g) for r in rows.split(40)])
    dev = next(clf.parameters()).device
    with torch.no_grad():
        pred = clf(clips[:, 0].reshape(-1, 1, CANVAS, CANVAS).to(dev)).argmax(1).view(-1, FRAMES)
    pred, clips = pred.cpu(), clips.cpu()
    frame_acc = (pred == (rows % 10)[:, None]).float().mean().item()
    motion_acc = (motion_of(clips) == rows // 10).float().mean().item()
    diff = (clips[:, 0, 1:] - clips[:, 0, :-1]).abs().mean().item()
    return clips, rows, frame_acc, motion_acc, diff


def save_clips(path, clips, n):
    """The first n clips, one per row, frames left to right: an 8-bit PGM."""
    a = ((clips[:n, 0].clamp(-1, 1) + 1) * 127.5).round().byte().numpy()  # [n, F, H, W]
    grid = a.transpose(0, 2, 1, 3).reshape(n * CANVAS, FRAMES * CANVAS)
    with open(path, "wb") as f:
        f.write(b"P5 %d %d 255\n" % (grid.shape[1], grid.shape[0]))
        f.write(grid.tobytes())


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------

def load_items(path):
    data = np.load(path)
    return (shrink(data["train_x"]), torch.tensor(data["train_y"], dtype=torch.long),
            shrink(data["test_x"]), torch.tensor(data["test_y"], dtype=torch.long))


def cmd_clips(a):
    items, labels, _, _ = load_items(a.data)
    clips, cond, _ = random_clips(items, labels, torch.Generator().manual_seed(0), 16)
    save_clips(a.out, clips, 16)
    print("conditions:", [f"{CLASSES[c % 10]} {MOTIONS[c // 10]}" for c in cond.tolist()])


def lr_at(a, step, frac):
    warm = min(1.0, (step + 1) / a.warmup)
    return a.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def flow_loss(model, x0, cond, g, a):
    """Flow matching: x_s = (1 - s) x0 + s e, target v = e - x0; s logit-normal (SD3, Wan)."""
    n, dev = x0.shape[0], x0.device
    drop = (torch.rand(n, generator=g) < a.label_dropout).to(dev)
    cond = torch.where(drop, torch.full_like(cond, CFG["num_conditions"]), cond)
    s = torch.sigmoid(torch.randn(n, generator=g)).to(dev)
    e = torch.randn(x0.shape, generator=g).to(dev)
    sb = s[:, None, None, None, None]
    xs, target = (1 - sb) * x0 + sb * e, e - x0
    return F.mse_loss(model.velocity(xs, s, cond), target)


def train_step(model, opt, items, labels, g, a):
    """One step on a.batch clips plus a.frame_batch single frames of other clips: a frame is a
    video of one frame (its tokens at time 0), 1/64 of a clip's attention, so the items'
    appearance is learnt from many more of them than whole clips alone would show."""
    x0, cond, _ = random_clips(items, labels, g, a.batch)
    loss = flow_loss(model, x0, cond, g, a)
    if a.frame_batch > 0:
        clips, fcond, _ = random_clips(items, labels, g, a.frame_batch)
        frame = torch.randint(0, FRAMES, (a.frame_batch,), generator=g).to(clips.device)
        pick = torch.arange(a.frame_batch, device=clips.device)
        frames = clips[pick, :, frame][:, :, None]  # [N, 1, 1, H, W]
        loss = loss + flow_loss(model, frames, fcond, g, a)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def cmd_train(a):
    torch.set_num_threads(a.threads)
    os.makedirs(a.out, exist_ok=True)
    items, labels, test_items, test_labels = load_items(a.data)
    items, labels = items.to(a.device), labels.to(a.device)
    log = open(os.path.join(a.out, "train_log.txt"), "a")

    def say(msg):
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    torch.manual_seed(a.seed)
    model = WanFmnist().to(a.device)
    model.init_for_training()
    ema = WanFmnist().to(a.device)
    ema.load_state_dict(model.state_dict())
    ema.requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0, betas=(0.9, 0.99))
    step, avg, spent = 0, None, 0.0
    ck = os.path.join(a.out, "ckpt.pt")
    if os.path.exists(ck):  # resume
        st = torch.load(ck, map_location=a.device)
        model.load_state_dict(st["model"])
        ema.load_state_dict(st["ema"])
        opt.load_state_dict(st["opt"])
        step, avg, spent = st["step"], st["loss"], st["spent"]
        say(f"resumed at step {step} ({spent:.0f} s spent)")
    params = sum(p.numel() for p in model.parameters())
    where = torch.cuda.get_device_name() if a.device.startswith("cuda") else f"{a.threads} threads"
    say(f"{a.device} ({where}), {a.threads} threads, torch {torch.__version__}, {params} parameters, "
        f"batch {a.batch} clips + {a.frame_batch} frames, lr {a.lr}, budget {a.minutes} min, "
        f"clips of {FRAMES} x {CANVAS}^2")
    g = torch.Generator().manual_seed(a.seed + step)
    t0 = time.time() - spent
    started = time.time()
    budget = a.minutes * 60

    def save_ckpt():
        torch.save({"model": model.state_dict(), "ema": ema.state_dict(),
                    "opt": opt.state_dict(), "step": step, "loss": avg,
                    "spent": time.time() - t0}, ck)

    while time.time() - t0 < budget:
        if a.stop_after and time.time() - started > a.stop_after:
            save_ckpt()  # a pause: the same command resumes from here, on the same schedule
            say(f"paused at step {step} ({time.time() - t0:.0f} s of {budget:.0f} spent)")
            return
        lr = lr_at(a, step, (time.time() - t0) / budget)
        for pg in opt.param_groups:
            pg["lr"] = lr
        lv = train_step(model, opt, items, labels, g, a)
        avg = lv if avg is None else 0.98 * avg + 0.02 * lv
        with torch.no_grad():
            decay = min(a.ema, (1 + step) / (10 + step))
            for pe, pm in zip(ema.parameters(), model.parameters()):
                pe.lerp_(pm, 1 - decay)
        step += 1
        if step % 100 == 0:
            say(f"step {step} t {time.time() - t0:.0f}s lr {lr:.2e} loss {avg:.4f}")
        if step % a.ckpt_every == 0:
            save_ckpt()
    ema = ema.cpu()
    torch.save({"ema": ema.state_dict(), "step": step, "loss": avg},
               os.path.join(a.out, "ema.pt"))
    say(f"trained {step} steps ({step * a.batch} clips) in {time.time() - t0:.0f}s, "
        f"final loss (EMA) {avg:.4f}")
    write_safetensors(os.path.join(a.out, "wan-fmnist.safetensors"),
                      {k: v.float().numpy() for k, v in ema.state_dict().items()}, "BF16",
                      {"steps": step, "batch": a.batch})


def cmd_classifier(a):
    """Trains the frame classifier and writes it as safetensors (the test suite's judge)."""
    torch.set_num_threads(a.threads)
    items, labels, test_items, test_labels = load_items(a.data)
    clf, acc, steps = train_classifier(items, labels, test_items, test_labels, a.seconds)
    print(f"frame classifier: {steps} steps of 32 frames, accuracy {acc:.4f} on 2000 frames of "
          f"held-out test items")
    write_safetensors(a.out, {k: v.float().numpy() for k, v in clf.state_dict().items()}, "F32",
                      {"steps": steps, "test_accuracy": f"{acc:.4f}"})


def load_classifier(path):
    clf = FrameClassifier()
    clf.load_state_dict({k: torch.tensor(v) for k, v in read_safetensors(path).items()})
    return clf.eval()


def cmd_score(a):
    torch.set_num_threads(a.threads)
    model = WanFmnist()
    model.load_state_dict(torch.load(a.ckpt, map_location="cpu")["ema"])
    model.to(a.device).eval()
    clf = load_classifier(a.classifier).to(a.device)
    for scale in a.cfg:
        clips, rows, fa, ma, diff = score(model, clf, a.per_condition, a.steps, scale, a.shift, 11)
        print(f"samples: {a.steps} steps, cfg {scale}: frames of the class asked for {fa:.4f}, "
              f"motion as asked {ma:.4f}, mean |frame difference| {diff:.3f} "
              f"({rows.shape[0]} clips)", flush=True)
        if a.out:
            save_clips(a.out.replace(".pgm", f"_cfg{scale}.pgm"), clips[::a.per_condition], 40)


def randomize(model):
    """Random weights everywhere (training's zero-init would hide most of the network)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm_q" in name or "norm_k" in name or name.endswith("norm2.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif "class_embedding" in name:
                p.copy_(torch.randn_like(p))
            elif p.dim() >= 2 and "table" not in name:
                p.copy_(torch.randn_like(p) / math.sqrt(p[0].numel()))
            else:
                p.copy_(0.1 * torch.randn_like(p))


def cmd_check(a):
    torch.manual_seed(0)
    model = WanFmnist()
    randomize(model)
    model.double()
    frames = 3
    video = torch.randn(1, 1, frames, CANVAS, CANVAS, dtype=torch.float64)
    sigma = torch.tensor([0.7], dtype=torch.float64)
    row = torch.tensor([27])
    with torch.no_grad():
        v = model.velocity(video, sigma, row)
    with tempfile.TemporaryDirectory() as tmp:
        wpath, ipath, opath = (os.path.join(tmp, n) for n in ("w.safetensors", "in.safetensors",
                                                                "out.safetensors"))
        write_safetensors(wpath, {k: t.float().numpy() for k, t in model.state_dict().items()})
        write_safetensors(ipath, {"latent": video[0].numpy(), "sigma": sigma.numpy(),
                                  "class_label": np.array([27.0])})
        subprocess.run([a.cocodiff, "forward", "--model", a.model, "--weights", wpath, "--input",
                        ipath, "--output", opath], check=True)
        got = read_safetensors(opath)["velocity"]
    ref = v[0].numpy()
    rel = np.linalg.norm(got.reshape(-1) - ref.reshape(-1)) / np.linalg.norm(ref)
    print(f"PyTorch vs cocodiff forward: relative L2 {rel:.3e} over {ref.size} values "
          f"(weights rounded to float32 on both sides)")
    if rel > a.tolerance:
        sys.exit(f"relative L2 {rel:.3e} above {a.tolerance}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("prepare")
    s.add_argument("--dataset-dir", default="/usr/share/datasets/fashion-mnist")
    s.add_argument("--out", required=True)
    s = sub.add_parser("clips")
    s.add_argument("--data", required=True)
    s.add_argument("--out", required=True)
    s = sub.add_parser("train")
    s.add_argument("--data", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--minutes", type=float, default=60.0)
    s.add_argument("--batch", type=int, default=32)
    s.add_argument("--lr", type=float, default=1e-3)
    s.add_argument("--warmup", type=int, default=200)
    s.add_argument("--ema", type=float, default=0.998)
    s.add_argument("--frame-batch", type=int, default=0)
    s.add_argument("--label-dropout", type=float, default=0.1)
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    s.add_argument("--ckpt-every", type=int, default=500, help="steps between checkpoints")
    s.add_argument("--stop-after", type=float, default=0.0,
                   help="seconds of this process after which to checkpoint and stop (0: never)")
    s = sub.add_parser("score")
    s.add_argument("--ckpt", required=True)
    s.add_argument("--out", default="")
    s.add_argument("--steps", type=int, default=20)
    s.add_argument("--shift", type=float, default=1.0)
    s.add_argument("--cfg", type=float, nargs="+", default=[1.0, 2.0, 3.0])
    s.add_argument("--per-condition", type=int, default=5)
    s.add_argument("--classifier", required=True, help="written by the classifier command")
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    s = sub.add_parser("classifier")
    s.add_argument("--data", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--seconds", type=float, default=120.0)
    s.add_argument("--threads", type=int, default=1)
    s = sub.add_parser("check")
    s.add_argument("--cocodiff", default="build/apps/cocodiff")
    s.add_argument("--model", default="wan-fmnist")
    s.add_argument("--tolerance", type=float, default=1e-5)
    a = p.parse_args()
    cmds = {"prepare": cmd_prepare, "clips": cmd_clips, "train": cmd_train, "score": cmd_score,
            "check": cmd_check, "classifier": cmd_classifier}
    cmds[a.cmd](a)


if __name__ == "__main__":
    main()
