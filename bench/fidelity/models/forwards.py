#!/usr/bin/env python3
"""Whole transformer forwards of the shipped DiT families with diffusers' own classes, on one GPU.

Usage: python3 bench/fidelity/models/forwards.py OUT --diffusers SRC_DIR [--families a,b] [--quick]
       [--budget-s 480] [--plan] [--mode eager|graph|compile|compile-graphs] [--cases WxH:B[:F],...]

--mode graph captures each case's forward once into a CUDA graph (torch.cuda.graph, the same
input tensors every call) and times its replays: diffusers' kernels with no host issue between
them. --mode compile times torch.compile(model, dynamic=False) (inductor's default mode, no CUDA
graphs), compiled afresh for each case (env.json: compile_s); --mode compile-graphs the same with
mode="reduce-overhead" (inductor's kernels replayed from CUDA graphs). --cases keeps only the cases
named.

SRC_DIR holds a diffusers source tree (SRC_DIR/diffusers/...) and optionally SRC_DIR/COMMIT; the
classes are imported from it, nothing is installed. Each model is built from its published config
with random bf16 weights made on the GPU (built under torch.device("cuda") with bf16 as the
default dtype: the classes' own initialisers, then .to(bfloat16)), one model in memory at a time,
eval mode, torch.inference_mode(), diffusers' default attention dispatch ("native":
F.scaled_dot_product_attention). Inputs are shaped as each pipeline shapes them (below). One
forward is timed with CUDA events around the call: warm-ups (2, or 1 when the first call takes a
second or more), then 3 to 10 timed calls (about 3 s), each followed by a synchronize; median,
min and max. host_ms is the median wall-clock time from the call until it returns, before the
synchronize: when it equals the device time the host issued the forward no faster than the GPU
ran it (host-bound), or the launch queue was full.

Writes OUT/forwards.csv (family,model,width,height,batch,image_tokens,text_tokens,median_ms,min_ms,
max_ms,host_ms,reps,frames; frames: video frames in pixel space, 1 for an image) and OUT/env.json (versions, the diffusers commit, each model's config,
parameter count and build time, every case with its status: ok, skipped for the budget, or the
exception it raised).

Models (configs/models/*.toml; the published transformer/config.json of each checkpoint):
  flux1-dev    FluxTransformer2DModel       19 double + 38 single blocks, 24 heads x 128, T5 512 tokens
               x 4096, pooled 768, guidance_embeds; pipeline: latents packed 2x2 -> [B, (H/16)(W/16),
               64], img_ids (0, row, col), txt_ids zeros [512, 3], timestep t/1000, guidance 3.5
  flux2-dev    Flux2Transformer2DModel      8 double + 48 single blocks, 48 heads x 128, SwiGLU 3.0, text
               512 x 15360 (three Mistral layers), ids (t, h, w, l); pipeline: [B, (H/16)(W/16), 128]
  sd35-large   SD3Transformer2DModel        38 blocks, 38 heads x 64 (2432), pos_embed_max_size 192,
               qk_norm rms_norm; pipeline: latents [B, 16, H/8, W/8], text 333 (77 CLIP + 256 T5) x 4096,
               pooled 2048, timestep in [0, 1000]
  sd35-medium  SD3Transformer2DModel        24 blocks, 24 heads x 64 (1536), dual attention in blocks 0-12,
               pos_embed_max_size 384
  qwen-image   QwenImageTransformer2DModel  60 blocks, 24 heads x 128, text 512 x 3584 (the preset's
               upper bound; no mask, as the pipeline passes for an unpadded prompt), img_shapes
               [(1, H/16, W/16)]; the pipeline's true CFG runs two batch-1 forwards a step
  wan2.1-t2v-1.3b, wan2.1-t2v-14b
               WanTransformer3DModel        30 / 40 blocks, 12 / 40 heads x 128, FFN 8960 / 13824, text
               512 x 4096 (umT5), patch (1, 2, 2); pipeline (WanPipeline): latents [B, 16, (F-1)/4+1,
               H/8, W/8], timestep t in [0, 1000], two batch-1 forwards a step (prompt, negative);
               832x480 with 33 and 81 frames (9 and 21 latent frames: 14,040 and 32,760 tokens)
  dit-xl-2     DiTTransformer2DModel        28 blocks, 16 heads x 72, class labels (class, null 1000),
               latents [B, 4, H/8, W/8]; 256^2 with DiT-XL-2-256's config (sample_size 32) and 512^2
               with DiT-XL-2-512's (sample_size 64) only
Sizes: 512^2, 1024x768 (width x height), 1024^2, 2048^2 (DiT: 256^2, 512^2; Wan: above); batch 1 and 2
for every image family (Wan: batch 1) (2 is the CFG batch of SD3.5 and DiT and the CFG-parallel pair of Qwen-Image; FLUX.1-dev and
FLUX.2-dev are guidance-distilled and run batch 1, batch 2 is timed for comparison).
"""
import argparse
import gc
import importlib
import os
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

SIZES = [(512, 512), (1024, 768), (1024, 1024), (2048, 2048)]

FAMILIES = {
    "dit-xl-2": {
        "family": "dit", "module": "dit_transformer_2d", "cls": "DiTTransformer2DModel", "text": 0,
        "config": {"num_attention_heads": 16, "attention_head_dim": 72, "in_channels": 4, "out_channels": 8,
                   "num_layers": 28, "dropout": 0.0, "norm_num_groups": 32, "attention_bias": True,
                   "sample_size": 32, "patch_size": 2, "activation_fn": "gelu-approximate",
                   "num_embeds_ada_norm": 1000, "upcast_attention": False, "norm_type": "ada_norm_zero",
                   "norm_elementwise_affine": False, "norm_eps": 1e-6},
        "quick": {"num_layers": 1, "num_attention_heads": 2},
        "sizes": [(256, 256), (512, 512)], "quick_sizes": [(256, 256)], "params": 0.675e9,
        "per_size": lambda w, h: {"sample_size": h // 8},   # DiT-XL-2-256: 32, DiT-XL-2-512: 64
    },
    "sd35-medium": {
        "family": "sd3", "module": "transformer_sd3", "cls": "SD3Transformer2DModel", "text": 333,
        "config": {"sample_size": 128, "patch_size": 2, "in_channels": 16, "num_layers": 24,
                   "attention_head_dim": 64, "num_attention_heads": 24, "joint_attention_dim": 4096,
                   "caption_projection_dim": 1536, "pooled_projection_dim": 2048, "out_channels": 16,
                   "pos_embed_max_size": 384, "dual_attention_layers": list(range(13)), "qk_norm": "rms_norm"},
        "quick": {"num_layers": 2, "num_attention_heads": 2, "caption_projection_dim": 128,
                  "dual_attention_layers": [0]},
        "sizes": SIZES, "params": 2.24e9,
    },
    "flux1-dev": {
        "family": "flux", "module": "transformer_flux", "cls": "FluxTransformer2DModel", "text": 512,
        "config": {"patch_size": 1, "in_channels": 64, "out_channels": None, "num_layers": 19,
                   "num_single_layers": 38, "attention_head_dim": 128, "num_attention_heads": 24,
                   "joint_attention_dim": 4096, "pooled_projection_dim": 768, "guidance_embeds": True,
                   "axes_dims_rope": [16, 56, 56]},
        "quick": {"num_layers": 1, "num_single_layers": 1, "num_attention_heads": 2},
        "sizes": SIZES, "params": 11.9e9,
    },
    "sd35-large": {
        "family": "sd3", "module": "transformer_sd3", "cls": "SD3Transformer2DModel", "text": 333,
        "config": {"sample_size": 128, "patch_size": 2, "in_channels": 16, "num_layers": 38,
                   "attention_head_dim": 64, "num_attention_heads": 38, "joint_attention_dim": 4096,
                   "caption_projection_dim": 2432, "pooled_projection_dim": 2048, "out_channels": 16,
                   "pos_embed_max_size": 192, "dual_attention_layers": [], "qk_norm": "rms_norm"},
        "quick": {"num_layers": 2, "num_attention_heads": 2, "caption_projection_dim": 128},
        "sizes": SIZES, "params": 8.06e9,
    },
    "qwen-image": {
        "family": "qwen-image", "module": "transformer_qwenimage", "cls": "QwenImageTransformer2DModel",
        "text": 512,
        "config": {"patch_size": 2, "in_channels": 64, "out_channels": 16, "num_layers": 60,
                   "attention_head_dim": 128, "num_attention_heads": 24, "joint_attention_dim": 3584,
                   "guidance_embeds": False, "axes_dims_rope": [16, 56, 56]},
        "quick": {"num_layers": 1, "num_attention_heads": 2},
        "sizes": SIZES, "params": 20.4e9,
    },
    "flux2-dev": {
        "family": "flux2", "module": "transformer_flux2", "cls": "Flux2Transformer2DModel", "text": 512,
        "config": {"patch_size": 1, "in_channels": 128, "out_channels": None, "num_layers": 8,
                   "num_single_layers": 48, "attention_head_dim": 128, "num_attention_heads": 48,
                   "joint_attention_dim": 15360, "timestep_guidance_channels": 256, "mlp_ratio": 3.0,
                   "axes_dims_rope": [32, 32, 32, 32], "rope_theta": 2000, "eps": 1e-6,
                   "guidance_embeds": True},
        "quick": {"num_layers": 1, "num_single_layers": 1, "num_attention_heads": 2},
        "sizes": SIZES, "params": 32.2e9,
    },
}
WAN = {"patch_size": [1, 2, 2], "attention_head_dim": 128, "in_channels": 16, "out_channels": 16,
       "text_dim": 4096, "freq_dim": 256, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads",
       "eps": 1e-6, "image_dim": None, "added_kv_proj_dim": None, "rope_max_seq_len": 1024}
FAMILIES["wan2.1-t2v-1.3b"] = {
    "family": "wan", "module": "transformer_wan", "cls": "WanTransformer3DModel", "text": 512,
    "config": dict(WAN, num_attention_heads=12, ffn_dim=8960, num_layers=30),
    "quick": {"num_layers": 1, "num_attention_heads": 2, "ffn_dim": 512},
    "sizes": [(832, 480)], "frames": [33, 81], "quick_sizes": [(256, 256)], "quick_frames": [5],
    "batches": (1,), "params": 1.42e9,
}
FAMILIES["wan2.1-t2v-14b"] = dict(FAMILIES["wan2.1-t2v-1.3b"],
                                  config=dict(WAN, num_attention_heads=40, ffn_dim=13824, num_layers=40),
                                  params=14.3e9)
ORDER = list(FAMILIES)      # cheapest first: a budget that runs out drops the largest models
QUICK_SIZES = [(256, 256), (512, 256)]


# ---- inputs, as the pipelines shape them -----------------------------------------------------------

def latent_frames(frames):
    """Wan-VAE: the first frame kept, every 4 after it one latent frame."""
    return (frames - 1) // 4 + 1


def tokens_of(spec, w, h, frames):
    return (latent_frames(frames) if spec["family"] == "wan" else 1) * (h // 16) * (w // 16)


def make_inputs(torch, name, spec, b, w, h, dev, frames=1):
    dt = torch.bfloat16
    cfg = spec["cfg"]
    r = lambda *s: torch.randn(*s, device=dev, dtype=dt)  # noqa: E731
    fam = spec["family"]
    if fam == "wan":        # WanPipeline: latents [B, 16, (F-1)/4+1, H/8, W/8], timestep t in [0, 1000]
        kw = {"hidden_states": r(b, cfg["in_channels"], latent_frames(frames), h // 8, w // 8),
              "timestep": torch.full((b,), 500.0, device=dev, dtype=torch.float32),
              "encoder_hidden_states": r(b, spec["text"], cfg["text_dim"]), "return_dict": False}
        return kw, tokens_of(spec, w, h, frames)
    if fam == "flux":       # FluxPipeline: prepare_latents / _pack_latents / _prepare_latent_image_ids
        hh, ww = h // 16, w // 16
        ids = torch.zeros(hh, ww, 3)
        ids[..., 1] += torch.arange(hh)[:, None]
        ids[..., 2] += torch.arange(ww)[None, :]
        kw = {"hidden_states": r(b, hh * ww, cfg["in_channels"]),
              "encoder_hidden_states": r(b, spec["text"], cfg["joint_attention_dim"]),
              "pooled_projections": r(b, cfg["pooled_projection_dim"]),
              "timestep": torch.full((b,), 0.5, device=dev, dtype=dt),           # t / 1000
              "img_ids": ids.reshape(hh * ww, 3).to(dev, dt),
              "txt_ids": torch.zeros(spec["text"], 3, device=dev, dtype=dt),
              "guidance": torch.full((1,), 3.5, device=dev, dtype=torch.float32).expand(b),
              "return_dict": False}
        return kw, hh * ww
    if fam == "flux2":      # Flux2Pipeline: prepare_latents / _prepare_latent_ids / _prepare_text_ids
        hh, ww = h // 16, w // 16
        one = torch.arange(1)
        img_ids = torch.cartesian_prod(one, torch.arange(hh), torch.arange(ww), one).unsqueeze(0).expand(b, -1, -1)
        txt_ids = torch.cartesian_prod(one, one, one, torch.arange(spec["text"])).unsqueeze(0).expand(b, -1, -1)
        kw = {"hidden_states": r(b, hh * ww, cfg["in_channels"]),
              "encoder_hidden_states": r(b, spec["text"], cfg["joint_attention_dim"]),
              "timestep": torch.full((b,), 0.5, device=dev, dtype=dt),
              "guidance": torch.full((1,), 4.0, device=dev, dtype=torch.float32).expand(b),
              "img_ids": img_ids.to(dev), "txt_ids": txt_ids.to(dev), "return_dict": False}
        return kw, hh * ww
    if fam == "sd3":        # StableDiffusion3Pipeline: latents [B, 16, H/8, W/8], timestep t in [0, 1000]
        kw = {"hidden_states": r(b, cfg["in_channels"], h // 8, w // 8),
              "encoder_hidden_states": r(b, spec["text"], cfg["joint_attention_dim"]),
              "pooled_projections": r(b, cfg["pooled_projection_dim"]),
              "timestep": torch.full((b,), 500.0, device=dev, dtype=torch.float32),
              "return_dict": False}
        return kw, (h // 16) * (w // 16)
    if fam == "qwen-image":  # QwenImagePipeline: packed latents, img_shapes, timestep t / 1000
        hh, ww = h // 16, w // 16
        kw = {"hidden_states": r(b, hh * ww, cfg["in_channels"]),
              "encoder_hidden_states": r(b, spec["text"], cfg["joint_attention_dim"]),
              "encoder_hidden_states_mask": None,
              "timestep": torch.full((b,), 0.5, device=dev, dtype=dt),
              "img_shapes": [[(1, hh, ww)]] * b, "guidance": None, "return_dict": False}
        return kw, hh * ww
    if fam == "dit":        # DiTPipeline: latents [B, 4, H/8, W/8], class labels (class, null), int timesteps
        labels = torch.tensor(([207, 1000] * b)[:b], device=dev)
        kw = {"hidden_states": r(b, cfg["in_channels"], h // 8, w // 8),
              "timestep": torch.full((b,), 500, device=dev, dtype=torch.long),
              "class_labels": labels, "return_dict": False}
        return kw, (h // 16) * (w // 16)
    raise ValueError(fam)


# ---- estimates --------------------------------------------------------------------------------------

def est_forward_s(spec, params, b, img, txt):
    """FLOPs at 400 TFLOP/s (linears: 2 x params x tokens; joint attention over the whole
    sequence in every attention layer), at least 40 ms of host issue time for a full model."""
    cfg = spec["cfg"]
    s = img + txt
    inner = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    layers = cfg.get("num_layers", 0) + cfg.get("num_single_layers", 0) + len(cfg.get("dual_attention_layers") or [])
    if spec["family"] == "wan":   # self-attention over the video only; cross-attention is small
        s = img
    flops = 2.0 * params * b * s + 4.0 * b * s * s * inner * layers
    return max(flops / 400e12, 0.04 if not spec.get("quick_mode") else 0.005)


def reps_for(first_s):
    warm = 2 if first_s < 1.0 else 1
    reps = int(min(10, max(3, round(3.0 / max(first_s, 1e-3)))))
    return warm, reps


# ---- diffusers import ------------------------------------------------------------------------------

def import_class(src, module, cls):
    """diffusers.models.transformers.<module>.<cls> from the source tree, without running
    diffusers/models/transformers/__init__.py (which imports every transformer of diffusers);
    falls back to the ordinary import."""
    if src not in sys.path:
        sys.path.insert(0, src)
    pkg = "diffusers.models.transformers"
    how = "module file"
    try:
        import diffusers.models  # noqa: F401  (lazy: imports no model)
        if pkg not in sys.modules:
            stub = types.ModuleType(pkg)
            stub.__path__ = [os.path.join(src, "diffusers", "models", "transformers")]
            stub.__package__ = pkg
            sys.modules[pkg] = stub
        mod = importlib.import_module(f"{pkg}.{module}")
    except Exception:  # noqa: BLE001
        sys.modules.pop(pkg, None)
        how = "package"
        mod = importlib.import_module(f"{pkg}.{module}")
    return getattr(mod, cls), how


def build(torch, klass, cfg):
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = klass(**cfg)
    finally:
        torch.set_default_dtype(prev)
    other = sorted({str(t.dtype) for t in list(model.parameters()) + list(model.buffers())
                    if t.dtype != torch.bfloat16 and t.is_floating_point()})
    # nn.Module.to: ModelMixin.to only adds a warning about _keep_in_fp32_modules (none here)
    torch.nn.Module.to(model, dtype=torch.bfloat16)
    model.eval()
    model.requires_grad_(False)
    return model, other


# ---- timing ----------------------------------------------------------------------------------------

def call_once(torch, model, kw):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    s.record()
    out = model(**kw)
    e.record()
    host = (time.perf_counter() - t0) * 1e3
    e.synchronize()
    return s.elapsed_time(e), host, out


class Graphed:
    """The forward captured once into a CUDA graph (static inputs: the same tensors every call) and
    replayed: the device runs eager PyTorch's kernels with no host issue between them."""

    def __init__(self, torch, model, kw):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):     # warm-up off the capture stream, as torch.cuda.graph asks
            model(**kw)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = model(**kw)
        torch.cuda.synchronize()

    def __call__(self, **_):
        self.graph.replay()
        return self.out


def time_case(torch, model, kw, budget, warm_extra=0):
    dev_ms, host_ms, _ = call_once(torch, model, kw)         # first warm-up
    for _ in range(warm_extra):                               # compile: the first calls compile
        dev_ms, host_ms, _ = call_once(torch, model, kw)
    warm, reps = reps_for(dev_ms / 1e3)
    for _ in range(warm - 1):
        dev_ms, host_ms, _ = call_once(torch, model, kw)
    fit = int((budget.left() - 5.0) / max(dev_ms / 1e3, 1e-3))
    if fit < 2:
        return None, f"budget: {budget.left():.0f} s left, a call takes {dev_ms / 1e3:.1f} s"
    reps = min(reps, fit)
    d, hs, out = [], [], None
    for _ in range(reps):
        a, b, out = call_once(torch, model, kw)
        d.append(a)
        hs.append(b)
    o = out[0] if isinstance(out, (tuple, list)) else getattr(out, "sample", out)
    finite = bool(torch.isfinite(o).all().item())
    d.sort()
    hs.sort()
    return {"median_ms": d[len(d) // 2], "min_ms": d[0], "max_ms": d[-1], "host_ms": hs[len(hs) // 2],
            "reps": reps, "finite": finite, "output_shape": list(o.shape)}, None


def run_case(torch, model, kw, budget, mode):
    """One case timed as MODE runs it: eager calls, replays of a CUDA graph of the eager forward,
    or torch.compile's forward (inductor's default mode, or reduce-overhead: with CUDA graphs)
    after it compiled for this shape."""
    if mode == "eager":
        return time_case(torch, model, kw, budget)
    if mode == "graph":
        g = Graphed(torch, model, kw)
        try:
            return time_case(torch, g, kw, budget)
        finally:
            g.graph.reset()
    torch._dynamo.reset()                 # one compiled graph per case, compiled for its shapes alone
    compiled = (torch.compile(model, dynamic=False) if mode == "compile" else
                torch.compile(model, dynamic=False, mode="reduce-overhead"))
    t0 = time.time()
    call_once(torch, compiled, kw)
    compile_s = time.time() - t0
    res, why = time_case(torch, compiled, kw, budget, warm_extra=1)
    if res is not None:
        res["compile_s"] = round(compile_s, 1)
    return res, why


def case_wanted(only, w, h, b, f):
    """--cases WxH:B[:F],... (empty: every case)."""
    return not only or f"{w}x{h}:{b}" in only or f"{w}x{h}:{b}:{f}" in only


def cases_of(name, spec, quick):
    sizes = spec.get("quick_sizes", QUICK_SIZES) if quick else spec["sizes"]
    frames = spec.get("quick_frames", [1]) if quick else spec.get("frames", [1])
    out = []
    for w, h in sorted(sizes, key=lambda s: s[0] * s[1]):
        for f in frames:
            for b in spec.get("batches", (1, 2)):
                out.append((w, h, b, f))
    return out


def config_of(spec, quick, w, h):
    cfg = dict(spec["config"])
    if "per_size" in spec:
        cfg.update(spec["per_size"](w, h))
    if quick:
        cfg.update(spec["quick"])
    return cfg


def plan(families, quick):
    total = 0.0
    for name in families:
        spec = dict(FAMILIES[name])
        spec["quick_mode"] = quick
        fam_s = 0.0
        for w, h, b, f in cases_of(name, spec, quick):
            spec["cfg"] = config_of(spec, quick, w, h)
            img = tokens_of(spec, w, h, f)
            t = est_forward_s(spec, spec["params"] if not quick else 1e7, b, img, spec["text"])
            warm, reps = reps_for(t)
            fam_s += (warm + reps) * t
            print(f"  {name} {w}x{h} f{f} b{b}: ~{t * 1e3:.0f} ms a forward, {warm}+{reps} calls")
        fam_s += spec["params"] * 2 / 40e9 if not quick else 1.0    # build: about 40 GB/s of weights
        print(f"{name}: ~{fam_s:.0f} s")
        total += fam_s
    print(f"total ~{total:.0f} s")


def diffusers_env(src, env):
    """The diffusers source tree into env: its path, commit, attention backend and (imported from
    src, first on sys.path) version; an import failure is listed in env["errors"]."""
    commit_file = os.path.join(src, "COMMIT")
    env.update({"diffusers_src": src,
                "diffusers_commit": open(commit_file).read().strip() if os.path.exists(commit_file) else None,
                "attention_backend": os.environ.get("DIFFUSERS_ATTN_BACKEND", "native (default)")})
    try:
        sys.path.insert(0, src)
        import diffusers
        env["diffusers_version"] = getattr(diffusers, "__version__", None)
    except Exception as ex:  # noqa: BLE001
        env["errors"].append(f"import diffusers: {ex!r}"[:600])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--diffusers", required=True, help="directory holding diffusers/ (and COMMIT)")
    ap.add_argument("--families", default=",".join(ORDER), help="comma-separated: " + ",".join(ORDER))
    ap.add_argument("--quick", action="store_true", help="tiny configs (few layers, small hidden) of every class")
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--plan", action="store_true", help="print the cases and their estimated time, run nothing")
    ap.add_argument("--mode", default="eager", choices=["eager", "graph", "compile", "compile-graphs"],
                    help="eager calls (default), replays of a CUDA graph of the eager forward, torch.compile, "
                         "or torch.compile with CUDA graphs (mode reduce-overhead)")
    ap.add_argument("--cases", default="", help="only these cases: WxH:BATCH[:FRAMES],... (default: all)")
    args = ap.parse_args()
    only = {c for c in args.cases.split(",") if c}
    fams = [f for f in args.families.split(",") if f]
    bad = [f for f in fams if f not in FAMILIES]
    if bad:
        sys.exit(f"forwards: unknown families {bad}; known: {','.join(ORDER)}")
    fams = [f for f in ORDER if f in fams]
    if args.plan:
        plan(fams, args.quick)
        return
    src = os.path.abspath(args.diffusers)
    if not os.path.isdir(os.path.join(src, "diffusers")):
        sys.exit(f"forwards: {src} holds no diffusers/ source tree")
    budget = bc.Budget(args.budget_s, [("all", 1.0)])
    import torch
    if not torch.cuda.is_available():
        sys.exit("forwards: no CUDA device")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    os.makedirs(args.out, exist_ok=True)
    env = bc.env_info(torch, dev)
    env.update({"script": "bench/fidelity/models/forwards.py", "argv": sys.argv[1:], "budget_s": args.budget_s,
                "quick": args.quick, "mode": args.mode, "models": [], "cases": [], "errors": []})
    diffusers_env(src, env)
    envpath = os.path.join(args.out, "env.json")
    bc.write_json(envpath, env)
    print({k: env.get(k) for k in ("gpu", "driver", "torch", "cuda", "diffusers_version", "diffusers_commit")},
          flush=True)
    csv = bc.CsvOut(os.path.join(args.out, "forwards.csv"),
                    ["family", "model", "width", "height", "batch", "image_tokens", "text_tokens", "median_ms",
                     "min_ms", "max_ms", "host_ms", "reps", "frames"])
    for name in fams:
        spec = dict(FAMILIES[name])
        spec["quick_mode"] = args.quick
        groups = {}   # one model per distinct config (DiT: one per sample_size)
        for w, h, b, f in cases_of(name, spec, args.quick):
            if not case_wanted(only, w, h, b, f):
                continue
            cfg = config_of(spec, args.quick, w, h)
            groups.setdefault(repr(sorted(cfg.items())), (cfg, []))[1].append((w, h, b, f))
        for cfg, cases in groups.values():
            spec["cfg"] = cfg
            rec = {"model": name, "class": spec["cls"], "config": cfg}
            env["models"].append(rec)
            first_est = est_forward_s(spec, spec["params"] if not args.quick else 1e7, cases[0][2],
                                      tokens_of(spec, cases[0][0], cases[0][1], cases[0][3]), spec["text"])
            build_est = 5.0 + spec["params"] * 2 / 40e9 if not args.quick else 5.0
            if budget.left() < build_est + 3 * first_est:
                rec["status"] = f"skipped: budget ({budget.left():.0f} s left)"
                for w, h, b, f in cases:
                    env["cases"].append({"model": name, "width": w, "height": h, "batch": b, "frames": f,
                                         "status": "skipped: budget before building the model"})
                print(f"{name}: skipped, {budget.left():.0f} s left", flush=True)
                continue
            model = None
            try:
                klass, how = import_class(src, spec["module"], spec["cls"])
                rec["import"] = how
                t0 = time.time()
                model, other = build(torch, klass, cfg)
                rec["cast_to_bf16_from"] = other
                torch.cuda.synchronize()
                rec["build_s"] = round(time.time() - t0, 2)
                rec["params"] = sum(p.numel() for p in model.parameters())
                rec["memory_after_build_bytes"] = torch.cuda.memory_allocated()
                rec["status"] = "built"
                print(f"{name}: {spec['cls']} built in {rec['build_s']} s, {rec['params'] / 1e9:.2f} B params "
                      f"(imported as {how}), at {budget.elapsed():.0f}s", flush=True)
            except Exception as ex:  # noqa: BLE001
                rec["status"] = f"error: {ex!r}"[:600]
                env["errors"].append(f"{name} build: {ex!r}"[:600])
                print(f"{name}: build failed: {ex!r}", flush=True)
                for w, h, b, f in cases:
                    env["cases"].append({"model": name, "width": w, "height": h, "batch": b, "frames": f,
                                         "status": "error: the model was not built"})
                model = None
                gc.collect()
                torch.cuda.empty_cache()
                bc.write_json(envpath, env)
                continue
            for w, h, b, f in cases:
                case = {"model": name, "width": w, "height": h, "batch": b, "frames": f}
                env["cases"].append(case)
                img = tokens_of(spec, w, h, f)
                est = est_forward_s(spec, rec["params"], b, img, spec["text"])
                warm, reps = reps_for(est)
                if budget.left() < (warm + 2) * est + 5.0:
                    case["status"] = f"skipped: budget ({budget.left():.0f} s left, ~{est:.1f} s a call)"
                    print(f"{name} {w}x{h} f{f} b{b}: {case['status']}", flush=True)
                    continue
                try:
                    torch.cuda.reset_peak_memory_stats()
                    with torch.inference_mode():
                        kw, img = make_inputs(torch, name, spec, b, w, h, dev, f)
                        res, why = run_case(torch, model, kw, budget, args.mode)
                    kw = None
                    if res is None:
                        case["status"] = f"skipped: {why}"
                        print(f"{name} {w}x{h} f{f} b{b}: {case['status']}", flush=True)
                        continue
                    case.update(res)
                    case["status"] = "ok"
                    case["mode"] = args.mode
                    case["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
                    case["image_tokens"], case["text_tokens"] = img, spec["text"]
                    csv.row([spec["family"], name, w, h, b, img, spec["text"], res["median_ms"], res["min_ms"],
                             res["max_ms"], res["host_ms"], res["reps"], f])
                    print(f"{name} {w}x{h} f{f} b{b}: {res['median_ms']:.2f} ms (host {res['host_ms']:.2f} ms, "
                          f"{res['reps']} reps, finite={res['finite']}) at {budget.elapsed():.0f}s", flush=True)
                except Exception as ex:  # noqa: BLE001
                    case["status"] = f"error: {ex!r}"[:600]
                    env["errors"].append(f"{name} {w}x{h} f{f} b{b}: {ex!r}"[:600])
                    print(f"{name} {w}x{h} f{f} b{b}: failed: {ex!r}", flush=True)
                    kw = None
                    gc.collect()
                    torch.cuda.empty_cache()
                bc.write_json(envpath, env)
            model = None
            gc.collect()
            torch.cuda.empty_cache()
            bc.write_json(envpath, env)
    csv.close()
    bc.finish_env(envpath, env, budget, "forwards")


if __name__ == "__main__":
    main()
