#!/usr/bin/env python3
"""One forward of diffusers' own WanTransformer3DModel in float64 on the CPU, on random weights and
inputs, as a conformance reference for `cocodiff forward` (dit/models/wan.cpp).

Usage: python3 bench/fidelity/models/wan_reference.py OUT --diffusers SRC_DIR [--seed 0]

The model has wan-tiny's structure cut to one block (configs/models/wan-tiny.toml with
model.double_blocks = 1, model.heads = 4): hidden 64 (4 heads x 16), FFN 192, text 8 tokens x 32,
timestep frequencies 32, patch (1, 2, 2), 16 latent channels, Q/K RMSNorm across heads, norm2
with affine, cross-attention to the text. Every parameter is drawn afresh (N(0, 1 / fan_in) for
matrices, N(0, 0.5^2) around 1 for norm scales, N(0, 0.1^2) otherwise) so that no norm scale is
1 and no bias is 0. The latent is [16, 3, 4, 6] (3 latent frames of 2 x 3 patches: 18 tokens).

Writes OUT/wan_weights.safetensors (the state dict, float32, diffusers' names),
OUT/wan_input.safetensors (latent [16, 3, 4, 6], sigma [1], text [8, 32]; float32),
OUT/wan_expected.safetensors (velocity [16, 3, 4, 6], float32 of the float64 output) and
OUT/wan_reference.json (versions, shapes, the model config). Only torch is needed; safetensors
files are written by hand.
"""
import argparse
import json
import os
import struct
import sys

CONFIG = {"patch_size": [1, 2, 2], "num_attention_heads": 4, "attention_head_dim": 16, "in_channels": 16,
          "out_channels": 16, "text_dim": 32, "freq_dim": 32, "ffn_dim": 192, "num_layers": 1,
          "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "image_dim": None,
          "added_kv_proj_dim": None, "rope_max_seq_len": 1024}
LATENT = (16, 3, 4, 6)
TEXT = (8, 32)
SIGMA = 0.6


def write_safetensors(path, tensors):
    """tensors: name -> float32 torch tensor (contiguous, CPU)."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().to("cpu").float().contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--diffusers", required=True, help="directory holding diffusers/")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from forwards import import_class  # noqa: E402  (the diffusers class from the source tree)
    import torch
    torch.manual_seed(a.seed)
    klass, how = import_class(os.path.abspath(a.diffusers), "transformer_wan", "WanTransformer3DModel")
    model = klass(**CONFIG).double().eval()
    g = torch.Generator().manual_seed(a.seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) / fan_in ** 0.5)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g, dtype=torch.float64))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64))
        # The weights as cocodiff reads them: float32. The reference runs on those values.
        for p in model.parameters():
            p.copy_(p.float().double())
        latent = torch.randn(LATENT, generator=g, dtype=torch.float64).float().double()
        text = torch.randn(TEXT, generator=g, dtype=torch.float64).float().double()
        t = torch.tensor([SIGMA * 1000.0], dtype=torch.float64)  # WanPipeline: timestep in [0, 1000]
        out = model(hidden_states=latent[None], timestep=t, encoder_hidden_states=text[None],
                    return_dict=False)[0][0]
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(os.path.join(a.out, "wan_weights.safetensors"),
                      {k: v for k, v in model.state_dict().items()})
    write_safetensors(os.path.join(a.out, "wan_input.safetensors"),
                      {"latent": latent, "sigma": torch.tensor([SIGMA]), "text": text})
    write_safetensors(os.path.join(a.out, "wan_expected.safetensors"), {"velocity": out})
    import diffusers
    info = {"script": "bench/fidelity/models/wan_reference.py", "seed": a.seed, "config": CONFIG,
            "latent": list(LATENT), "text": list(TEXT), "sigma": SIGMA, "dtype": "float64 on the CPU",
            "torch": torch.__version__, "diffusers_version": getattr(diffusers, "__version__", None),
            "import": how, "params": sum(p.numel() for p in model.parameters()),
            "output_norm": float(out.norm())}
    commit = os.path.join(a.diffusers, "COMMIT")
    if os.path.exists(commit):
        info["diffusers_commit"] = open(commit).read().strip()
    with open(os.path.join(a.out, "wan_reference.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
