#!/usr/bin/env python3
"""A small FLUX.1-structured DiT trained on Fashion-MNIST (pixel space, flow matching).

The PyTorch model below computes exactly what dit/models/flux.cpp computes (double-stream
blocks over [text, image] with per-head Q/K RMSNorm and 3-axis RoPE, single-stream blocks,
AdaLayerNormContinuous output), with diffusers' tensor names, so its state_dict is a checkpoint
the cocodiff loader reads. Class labels are learned conditioning tokens: a table of
`text_tokens x text_dim` embeddings and one pooled embedding per class, plus a null class
(row `num_classes`) used for classifier-free guidance; they replace the text encoder.

  prepare  --out data.npz                     the Debian dataset-fashion-mnist files as arrays
  train    --data data.npz --out DIR          flow-matching training (GPU if present)
  export   --ckpt DIR/ema.pt --out W.safetensors [--dtype bf16]
  check    --cocodiff build/apps/cocodiff     PyTorch vs `cocodiff forward` on random weights

Only numpy and torch are needed (safetensors files are written by hand).
"""

import argparse
import contextlib
import gzip
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# The shapes of configs/models/flux1-fmnist.toml.
CFG = dict(
    heads=24,
    head_dim=8,
    double_blocks=1,
    single_blocks=4,
    mlp_ratio=2.0,
    channels=1,
    patch=2,
    text_tokens=4,
    text_dim=32,
    pooled_dim=32,
    timestep_dim=64,
    rope_axes=(2, 2, 4),
    rope_theta=10000.0,
    num_classes=10,
    eps=1e-6,
)
RES = 28  # pixels per side
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot"]


# ---------------------------------------------------------------------------------------------
# The model (names as diffusers FluxTransformer2DModel)
# ---------------------------------------------------------------------------------------------

def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def layer_norm(x, eps):
    return F.layer_norm(x, (x.shape[-1],), eps=eps)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def timestep_embedding(t, dim, max_period=10000.0):
    """[cos(t f_i), sin(t f_i)], f_i = max_period^(-i/half)   t: [B] -> [B, dim]."""
    half = dim // 2
    f = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float64) / half)
    arg = t.double()[:, None] * f[None, :].to(t.device)
    return torch.cat([torch.cos(arg), torch.sin(arg)], dim=-1).float()


def rope_angles(pos, axes, theta):
    """pos: [N, 3] -> angles [N, head_dim/2], axes concatenated (frame, row, col)."""
    cols = []
    for a, d in enumerate(axes):
        j = torch.arange(d // 2, dtype=torch.float64)
        freq = 1.0 / theta ** (2.0 * j / d)
        cols.append(pos[:, a:a + 1].double() * freq[None, :])
    return torch.cat(cols, dim=1)


def apply_rope(x, cos, sin):
    """x: [B, H, N, D], interleaved pairs (x0, x1) rotated by the angle of pair i."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    y0 = x0 * cos - x1 * sin
    y1 = x0 * sin + x1 * cos
    return torch.stack([y0, y1], dim=-1).flatten(-2)


class FeedForward(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.net = nn.ModuleList([nn.Module(), nn.Identity(), nn.Linear(f, d)])
        self.net[0].proj = nn.Linear(d, f)

    def forward(self, x):
        return self.net[2](gelu_tanh(self.net[0].proj(x)))


class RMSWeight(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))


class AdaLN(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.linear = nn.Linear(d, n * d)


class JointAttention(nn.Module):
    def __init__(self, d, hd, joint):
        super().__init__()
        self.to_q, self.to_k, self.to_v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.norm_q, self.norm_k = RMSWeight(hd), RMSWeight(hd)
        if joint:
            self.add_q_proj, self.add_k_proj, self.add_v_proj = (nn.Linear(d, d), nn.Linear(d, d),
                                                                 nn.Linear(d, d))
            self.norm_added_q, self.norm_added_k = RMSWeight(hd), RMSWeight(hd)
            self.to_out = nn.ModuleList([nn.Linear(d, d)])
            self.to_add_out = nn.Linear(d, d)


def heads_of(x, h):
    b, n, d = x.shape
    return x.view(b, n, h, d // h).transpose(1, 2)


def attend(streams, heads, eps, cos, sin):
    """streams: list of (q, k, v, norm_q, norm_k) per stream in concat order ([text, image]);
    cos/sin: [N_total, D/2]. Returns each stream's output [B, N_s, D]."""
    qs, ks, vs, ns = [], [], [], []
    for q, k, v, nq, nk in streams:
        qs.append(rms_norm(heads_of(q, heads), nq, eps))
        ks.append(rms_norm(heads_of(k, heads), nk, eps))
        vs.append(heads_of(v, heads))
        ns.append(q.shape[1])
    q = apply_rope(torch.cat(qs, 2), cos, sin)
    k = apply_rope(torch.cat(ks, 2), cos, sin)
    v = torch.cat(vs, 2)
    if hasattr(F, "scaled_dot_product_attention"):
        o = F.scaled_dot_product_attention(q, k, v)
    else:  # PyTorch < 2.0
        o = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1) @ v
    b, h, n, hd = o.shape
    o = o.transpose(1, 2).reshape(b, n, h * hd)
    return list(torch.split(o, ns, dim=1))


def modulate(x, shift, scale, eps):
    return layer_norm(x, eps) * (1 + scale[:, None]) + shift[:, None]


class DoubleBlock(nn.Module):
    def __init__(self, d, hd, f):
        super().__init__()
        self.norm1, self.norm1_context = AdaLN(d, 6), AdaLN(d, 6)
        self.attn = JointAttention(d, hd, True)
        self.ff, self.ff_context = FeedForward(d, f), FeedForward(d, f)

    def forward(self, x, c, temb_silu, heads, eps, cos, sin):
        mi = self.norm1.linear(temb_silu).chunk(6, dim=1)
        mt = self.norm1_context.linear(temb_silu).chunk(6, dim=1)
        hi = modulate(x, mi[0], mi[1], eps)
        ht = modulate(c, mt[0], mt[1], eps)
        a = self.attn
        ot, oi = attend([(a.add_q_proj(ht), a.add_k_proj(ht), a.add_v_proj(ht),
                          a.norm_added_q.weight, a.norm_added_k.weight),
                         (a.to_q(hi), a.to_k(hi), a.to_v(hi), a.norm_q.weight, a.norm_k.weight)],
                        heads, eps, cos, sin)
        x = x + mi[2][:, None] * a.to_out[0](oi)
        x = x + mi[5][:, None] * self.ff(modulate(x, mi[3], mi[4], eps))
        c = c + mt[2][:, None] * a.to_add_out(ot)
        c = c + mt[5][:, None] * self.ff_context(modulate(c, mt[3], mt[4], eps))
        return x, c


class SingleBlock(nn.Module):
    def __init__(self, d, hd, f):
        super().__init__()
        self.norm = AdaLN(d, 3)
        self.proj_mlp = nn.Linear(d, f)
        self.attn = JointAttention(d, hd, False)
        self.proj_out = nn.Linear(d + f, d)

    def forward(self, x, c, temb_silu, heads, eps, cos, sin):
        shift, scale, gate = self.norm.linear(temb_silu).chunk(3, dim=1)
        s = torch.cat([c, x], dim=1)
        h = modulate(s, shift, scale, eps)
        mlp = gelu_tanh(self.proj_mlp(h))
        a = self.attn
        (o,) = attend([(a.to_q(h), a.to_k(h), a.to_v(h), a.norm_q.weight, a.norm_k.weight)],
                      heads, eps, cos, sin)
        s = s + gate[:, None] * self.proj_out(torch.cat([o, mlp], dim=-1))
        nt = c.shape[1]
        return s[:, nt:], s[:, :nt]


class MLPEmbedder(nn.Module):
    def __init__(self, i, d):
        super().__init__()
        self.linear_1, self.linear_2 = nn.Linear(i, d), nn.Linear(d, d)

    def forward(self, x):
        return self.linear_2(F.silu(self.linear_1(x)))


class FluxFmnist(nn.Module):
    def __init__(self, cfg=CFG):
        super().__init__()
        self.cfg = cfg
        d = cfg["heads"] * cfg["head_dim"]
        f = int(d * cfg["mlp_ratio"])
        tf = cfg["channels"] * cfg["patch"] ** 2
        self.x_embedder = nn.Linear(tf, d)
        self.context_embedder = nn.Linear(cfg["text_dim"], d)
        self.time_text_embed = nn.Module()
        self.time_text_embed.timestep_embedder = MLPEmbedder(cfg["timestep_dim"], d)
        self.time_text_embed.text_embedder = MLPEmbedder(cfg["pooled_dim"], d)
        self.transformer_blocks = nn.ModuleList(
            [DoubleBlock(d, cfg["head_dim"], f) for _ in range(cfg["double_blocks"])])
        self.single_transformer_blocks = nn.ModuleList(
            [SingleBlock(d, cfg["head_dim"], f) for _ in range(cfg["single_blocks"])])
        self.norm_out = AdaLN(d, 2)
        self.proj_out = nn.Linear(d, tf)
        # Learned class conditioning in place of text embeddings (+ a null class for CFG).
        self.class_embedding = nn.Module()
        self.class_embedding.text = nn.Embedding(cfg["num_classes"] + 1,
                                                 cfg["text_tokens"] * cfg["text_dim"])
        self.class_embedding.pooled = nn.Embedding(cfg["num_classes"] + 1, cfg["pooled_dim"])
        self._rope_cache = {}

    def init_for_training(self):
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        for b in list(self.transformer_blocks) + list(self.single_transformer_blocks):
            for ada in [getattr(b, n) for n in ("norm1", "norm1_context", "norm") if hasattr(b, n)]:
                nn.init.zeros_(ada.linear.weight)
                nn.init.zeros_(ada.linear.bias)
        nn.init.zeros_(self.norm_out.linear.weight)
        nn.init.zeros_(self.norm_out.linear.bias)
        nn.init.zeros_(self.proj_out.weight)
        nn.init.zeros_(self.proj_out.bias)
        nn.init.normal_(self.class_embedding.text.weight, std=1.0)
        nn.init.normal_(self.class_embedding.pooled.weight, std=1.0)

    def rope(self, grid, nt, device):
        key = (grid, nt, str(device))
        if key not in self._rope_cache:
            rows = torch.arange(grid * grid) // grid
            cols = torch.arange(grid * grid) % grid
            img = torch.stack([torch.zeros_like(rows), rows, cols], 1)
            pos = torch.cat([torch.zeros(nt, 3, dtype=torch.long), img], 0)
            ang = rope_angles(pos, self.cfg["rope_axes"], self.cfg["rope_theta"])
            self._rope_cache[key] = (torch.cos(ang).float().to(device),
                                     torch.sin(ang).float().to(device))
        return self._rope_cache[key]

    def forward(self, tokens, sigma, text, pooled, grid):
        """tokens [B, n, C*p*p], sigma [B], text [B, Nt, text_dim], pooled [B, P]."""
        cfg = self.cfg
        eps, heads = cfg["eps"], cfg["heads"]
        x = self.x_embedder(tokens)
        c = self.context_embedder(text)
        temb = self.time_text_embed.timestep_embedder(
            timestep_embedding(sigma * 1000.0, cfg["timestep_dim"]).to(tokens.dtype))
        temb = temb + self.time_text_embed.text_embedder(pooled)
        ts = F.silu(temb)
        cos, sin = self.rope(grid, c.shape[1], tokens.device)
        for b in self.transformer_blocks:
            x, c = b(x, c, ts, heads, eps, cos, sin)
        for b in self.single_transformer_blocks:
            x, c = b(x, c, ts, heads, eps, cos, sin)
        scale, shift = self.norm_out.linear(ts).chunk(2, dim=1)
        return self.proj_out(modulate(x, shift, scale, eps))

    def conditioning(self, labels):
        cfg = self.cfg
        text = self.class_embedding.text(labels).view(-1, cfg["text_tokens"], cfg["text_dim"])
        return text, self.class_embedding.pooled(labels)

    def velocity(self, img, sigma, labels):
        """img [B, C, H, W] -> v [B, C, H, W]."""
        text, pooled = self.conditioning(labels)
        grid = img.shape[-1] // self.cfg["patch"]
        return unpatchify(self(patchify(img, self.cfg["patch"]), sigma, text, pooled, grid),
                          self.cfg["patch"], img.shape[1])


def patchify(img, p):
    """[B, C, H, W] -> [B, (H/p)(W/p), C*p*p], features (c, py, px) as dit/layers.cpp."""
    b, c, h, w = img.shape
    x = img.view(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // p) * (w // p), c * p * p)


def unpatchify(tok, p, c):
    b, n, _ = tok.shape
    g = int(round(math.sqrt(n)))
    x = tok.view(b, g, g, c, p, p).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c, g * p, g * p)


def sigma_schedule(steps):
    """linspace(1, 1/N, N) then 0: the unshifted flow-matching Euler schedule."""
    s = [1.0 + (1.0 / steps - 1.0) * i / (steps - 1) if steps > 1 else 1.0 for i in range(steps)]
    return s + [0.0]


@torch.no_grad()
def sample(model, labels, steps, cfg_scale, generator, device):
    """Euler sampling from noise; cfg_scale 1 is one pass, else uncond + s (cond - uncond)."""
    n = labels.shape[0]
    x = torch.randn(n, 1, RES, RES, generator=generator, device=device)
    s = sigma_schedule(steps)
    null = torch.full_like(labels, model.cfg["num_classes"])
    for i in range(steps):
        sig = torch.full((n,), s[i], device=device)
        if cfg_scale == 1.0:
            v = model.velocity(x, sig, labels)
        else:
            v2 = model.velocity(torch.cat([x, x]), torch.cat([sig, sig]), torch.cat([labels, null]))
            vc, vu = v2.chunk(2)
            v = vu + cfg_scale * (vc - vu)
        x = x + (s[i + 1] - s[i]) * v
    return x


# ---------------------------------------------------------------------------------------------
# Data and files
# ---------------------------------------------------------------------------------------------

def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    if magic == 2051:
        r, c = struct.unpack(">II", data[8:16])
        return np.frombuffer(data, np.uint8, offset=16).reshape(n, r, c)
    return np.frombuffer(data, np.uint8, offset=8)


def cmd_prepare(a):
    d = a.dataset_dir
    arrays = dict(
        train_x=read_idx(os.path.join(d, "train-images-idx3-ubyte.gz")),
        train_y=read_idx(os.path.join(d, "train-labels-idx1-ubyte.gz")),
        test_x=read_idx(os.path.join(d, "t10k-images-idx3-ubyte.gz")),
        test_y=read_idx(os.path.join(d, "t10k-labels-idx1-ubyte.gz")),
    )
    np.savez_compressed(a.out, **arrays)
    print({k: v.shape for k, v in arrays.items()})


def write_safetensors(path, tensors, dtype="F32", metadata=None):
    """tensors: name -> float32 numpy array. F32 or BF16 (round to nearest even)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype=np.float32)
        if dtype == "BF16":
            u = a.view(np.uint32).astype(np.uint64)
            u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
            raw = u.astype(np.uint16).tobytes()
        else:
            raw = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (len(h) + 8) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        raw = data[e["data_offsets"][0]:e["data_offsets"][1]]
        if e["dtype"] == "F32":
            a = np.frombuffer(raw, np.float32)
        elif e["dtype"] == "BF16":
            a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(e["dtype"])
        out[name] = a.reshape(e["shape"]).copy()
    return out


def state_to_numpy(model):
    return {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------
# Equivalence with `cocodiff forward`
# ---------------------------------------------------------------------------------------------

def cmd_check(a):
    torch.manual_seed(0)
    model = FluxFmnist()
    # Random weights everywhere (training's zero-init would hide most of the network).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm_q.weight") or "norm_k" in name or "norm_added" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif p.dim() == 2 and "class_embedding" not in name:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[1]))
            else:
                p.copy_(0.1 * torch.randn_like(p) if "class" not in name else torch.randn_like(p))
    model.double()
    img = torch.randn(1, 1, RES, RES, dtype=torch.float64)
    sigma = torch.tensor([0.7], dtype=torch.float64)
    label = torch.tensor([3])
    text, pooled = model.conditioning(label)
    with torch.no_grad():
        grid = RES // CFG["patch"]
        v = unpatchify(model(patchify(img, CFG["patch"]), sigma, text, pooled, grid), CFG["patch"], 1)
    with tempfile.TemporaryDirectory() as tmp:
        wpath, ipath, opath = (os.path.join(tmp, n) for n in ("w.safetensors", "in.safetensors",
                                                                "out.safetensors"))
        write_safetensors(wpath, state_to_numpy(model))
        write_safetensors(ipath, {"latent": img[0].numpy(), "sigma": sigma.numpy(),
                                  "text": text[0].detach().numpy(),
                                  "pooled": pooled.detach().numpy()})
        subprocess.run([a.cocodiff, "forward", "--model", a.model, "--weights", wpath, "--input",
                        ipath, "--output", opath], check=True)
        got = read_safetensors(opath)["velocity"]
    ref = v[0].numpy()
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    print(f"PyTorch (fp64) vs cocodiff forward: relative L2 {rel:.3e} over {ref.size} values")
    if rel > a.tolerance:
        sys.exit(f"relative L2 {rel:.3e} above {a.tolerance}")


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------

class Classifier(nn.Module):
    """A small CNN that scores generated samples (about 91-92% on the test set)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(64 * 49, 256), nn.ReLU(), nn.Dropout(0.3), nn.Linear(256, 10))

    def forward(self, x):
        return self.net(x)


def train_classifier(x, y, tx, ty, device, seconds):
    clf = Classifier().to(device)
    opt = torch.optim.Adam(clf.parameters(), 1e-3)
    g = torch.Generator(device=device).manual_seed(1)
    t0 = time.time()
    step = 0
    while time.time() - t0 < seconds:
        idx = torch.randint(0, x.shape[0], (256,), device=device, generator=g)
        loss = F.cross_entropy(clf(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
    clf.eval()
    with torch.no_grad():
        acc = (clf(tx).argmax(1) == ty).float().mean().item()
    return clf, acc, step


def save_grid(path, imgs, rows):
    """imgs [N, 1, 28, 28] in [-1, 1] -> an 8-bit grayscale PGM grid."""
    a = ((imgs.clamp(-1, 1) + 1) * 127.5).round().byte().cpu().numpy()[:, 0]
    n = a.shape[0]
    cols = (n + rows - 1) // rows
    grid = np.zeros((rows * RES, cols * RES), np.uint8)
    for i in range(n):
        r, c = divmod(i, cols)
        grid[r * RES:(r + 1) * RES, c * RES:(c + 1) * RES] = a[i]
    with open(path, "wb") as f:
        f.write(b"P5 %d %d 255\n" % (grid.shape[1], grid.shape[0]))
        f.write(grid.tobytes())


def cmd_train(a):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    os.makedirs(a.out, exist_ok=True)
    data = np.load(a.data)
    x = torch.tensor(data["train_x"], dtype=torch.float32, device=device)[:, None] / 127.5 - 1
    y = torch.tensor(data["train_y"], dtype=torch.long, device=device)
    tx = torch.tensor(data["test_x"], dtype=torch.float32, device=device)[:, None] / 127.5 - 1
    ty = torch.tensor(data["test_y"], dtype=torch.long, device=device)
    log = open(os.path.join(a.out, "train_log.txt"), "w")

    def say(msg):
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    torch.manual_seed(a.seed)
    model = FluxFmnist().to(device)
    model.init_for_training()
    ema = FluxFmnist().to(device)
    ema.load_state_dict(model.state_dict())
    ema.requires_grad_(False)
    params = sum(p.numel() for p in model.parameters())
    say(f"device {device} ({torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}), "
        f"{params} parameters, batch {a.batch}, lr {a.lr}, budget {a.minutes} min")
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0, betas=(0.9, 0.99),
                            **({"fused": True} if device == "cuda" else {}))
    ema_params, model_params = list(ema.parameters()), list(model.parameters())
    g = torch.Generator(device=device).manual_seed(a.seed)
    t0 = time.time()
    step, avg = 0, None
    budget = a.minutes * 60
    warm = 500
    while True:
        elapsed = time.time() - t0
        if elapsed > budget or (a.max_steps and step >= a.max_steps):
            break
        frac = min(1.0, elapsed / budget)
        lr = a.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for pg in opt.param_groups:
            pg["lr"] = lr
        idx = torch.randint(0, x.shape[0], (a.batch,), device=device, generator=g)
        x0, lab = x[idx], y[idx]
        if a.hflip:
            flip = torch.rand(a.batch, device=device, generator=g) < 0.5
            x0 = torch.where(flip[:, None, None, None], x0.flip(-1), x0)
        drop = torch.rand(a.batch, device=device, generator=g) < a.label_dropout
        lab = torch.where(drop, torch.full_like(lab, CFG["num_classes"]), lab)
        # Flow matching: x_s = (1 - s) x0 + s e, target v = e - x0; s logit-normal (SD3).
        s = torch.sigmoid(torch.randn(a.batch, device=device, generator=g))
        e = torch.randn(x0.shape, device=device, generator=g)
        xs = (1 - s[:, None, None, None]) * x0 + s[:, None, None, None] * e
        amp = (torch.autocast(device_type="cuda", dtype=torch.bfloat16) if device == "cuda"
               else contextlib.nullcontext())
        with amp:
            v = model.velocity(xs, s, lab)
        loss = F.mse_loss(v.float(), e - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            decay = min(a.ema, (1 + step) / (10 + step))
            if hasattr(torch, "_foreach_lerp_"):
                torch._foreach_lerp_(ema_params, model_params, 1 - decay)
            else:
                for pe, pm in zip(ema_params, model_params):
                    pe.lerp_(pm, 1 - decay)
        step += 1
        lv = loss.item() if step % 50 == 0 else None
        if lv is not None:
            avg = lv if avg is None else 0.9 * avg + 0.1 * lv
        if step % 1000 == 0:
            say(f"step {step} t {time.time() - t0:.0f}s lr {lr:.2e} loss {avg:.4f}")
        if step % 10000 == 0:
            torch.save({"ema": ema.state_dict(), "step": step, "loss": avg},
                       os.path.join(a.out, "ema.pt"))
    train_s = time.time() - t0
    torch.save({"ema": ema.state_dict(), "step": step, "loss": avg}, os.path.join(a.out, "ema.pt"))
    say(f"trained {step} steps in {train_s:.0f}s ({step * a.batch / 60000:.1f} epochs), "
        f"final loss (EMA of logged values) {avg:.4f}")

    # Held-out flow-matching loss of the EMA model at fixed noise levels.
    ema.eval()
    with torch.no_grad():
        gg = torch.Generator(device=device).manual_seed(7)
        losses = []
        for sv in (0.1, 0.3, 0.5, 0.7, 0.9):
            e = torch.randn(tx[:2000].shape, device=device, generator=gg)
            s = torch.full((2000,), sv, device=device)
            xs = (1 - sv) * tx[:2000] + sv * e
            losses.append(F.mse_loss(ema.velocity(xs, s, ty[:2000]), e - tx[:2000]).item())
        say("test loss at sigma 0.1/0.3/0.5/0.7/0.9: " + " ".join(f"{l:.4f}" for l in losses))

    clf, acc, csteps = train_classifier(x, y, tx, ty, device, a.classifier_seconds)
    say(f"classifier: {csteps} steps, test accuracy {acc:.4f}")
    labels = torch.arange(10, device=device).repeat_interleave(a.samples_per_class)
    for steps in (20,):
        for scale in (1.0, 1.5, 2.0, 3.0):
            gs = torch.Generator(device=device).manual_seed(11)
            imgs = sample(ema, labels, steps, scale, gs, device)
            with torch.no_grad():
                pred = clf(imgs.clamp(-1, 1)).argmax(1)
            acc_g = (pred == labels).float().mean().item()
            say(f"samples: {steps} steps, cfg {scale}: classifier accuracy {acc_g:.4f} "
                f"on {labels.shape[0]} (pixel mean {imgs.mean().item():.3f}, data "
                f"{tx.mean().item():.3f})")
            save_grid(os.path.join(a.out, f"samples_cfg{scale}.pgm"),
                      imgs.view(10, a.samples_per_class, 1, RES, RES)[:, :12].reshape(-1, 1, RES, RES), 10)
    write_safetensors(os.path.join(a.out, "flux1-fmnist.safetensors"),
                      {k: v.float().cpu().numpy() for k, v in ema.state_dict().items()}, "BF16",
                      {"steps": step, "batch": a.batch})


def cmd_export(a):
    ck = torch.load(a.ckpt, map_location="cpu")
    sd = {k: v.float().numpy() for k, v in ck["ema"].items()}
    write_safetensors(a.out, sd, a.dtype.upper())
    print(f"{a.out}: {len(sd)} tensors, step {ck['step']}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("prepare")
    s.add_argument("--dataset-dir", default="/usr/share/datasets/fashion-mnist")
    s.add_argument("--out", required=True)
    s = sub.add_parser("train")
    s.add_argument("--data", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--minutes", type=float, default=7.0)
    s.add_argument("--max-steps", type=int, default=0)
    s.add_argument("--batch", type=int, default=512)
    s.add_argument("--lr", type=float, default=1e-3)
    s.add_argument("--ema", type=float, default=0.999)
    s.add_argument("--label-dropout", type=float, default=0.1)
    s.add_argument("--hflip", action="store_true")
    s.add_argument("--classifier-seconds", type=float, default=25.0)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--samples-per-class", type=int, default=100)
    s = sub.add_parser("export")
    s.add_argument("--ckpt", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    s = sub.add_parser("check")
    s.add_argument("--cocodiff", default="build/apps/cocodiff")
    s.add_argument("--model", default="flux1-fmnist")
    s.add_argument("--tolerance", type=float, default=1e-5)
    a = p.parse_args()
    {"prepare": cmd_prepare, "train": cmd_train, "export": cmd_export, "check": cmd_check}[a.cmd](a)


if __name__ == "__main__":
    main()
