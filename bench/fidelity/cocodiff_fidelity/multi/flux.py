"""The model: FLUX.1-dev's blocks as cocodiff's FLUX model runs them (dit/models/flux.cpp,
dit/parallel/sp_attention.cpp), in eager PyTorch, one rank of a Ulysses group; random weights of
the real shapes (a tiny model with --cpu)."""
import math
import time

from ..lazy import F, dist, torch
from . import runtime as rt
from .runtime import waited
from .timing import Span
from .collectives import all_gather


def rms(x, w):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, 1e-6)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def rope(x, cos, sin):  # diffusers apply_rotary_emb (use_real, unbind_dim=-1): x [n, h, dh]
    xr, xi = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    rot = torch.stack([-xi, xr], dim=-1).flatten(-2)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


def sdpa(q, k, v):  # [1, h, s, dh]
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v)
    a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1)
    return a @ v


def norm_mod(x, shift, scale):
    return F.layer_norm(x, (x.shape[-1],), eps=1e-6) * (1 + scale) + shift


def gelu(x):
    return F.gelu(x, approximate="tanh")


def W(o, i):
    return (torch.randn(o, i, device=rt.dev, dtype=rt.DT) * (1.0 / math.sqrt(i)))


class Model:
    """Random weights of FLUX.1-dev's shape, each rank keeping what Ulysses needs on it: every
    weight, except that the replicated text stream's Q/K/V keep this rank's heads."""

    def __init__(self, w, rank):
        hl = rt.HEADS // w
        lo, hi = rank * hl * rt.HD, (rank + 1) * hl * rt.HD
        self.w, self.rank, self.hl = w, rank, hl
        self.double = []
        for _ in range(rt.DOUBLE):
            b = {"mod_img": W(6 * rt.HID, rt.HID), "mod_txt": W(6 * rt.HID, rt.HID), "out": W(rt.HID, rt.HID),
                 "add_out": W(rt.HID, rt.HID), "fc1": W(rt.MLP, rt.HID), "fc2": W(rt.HID, rt.MLP),
                 "fc1_c": W(rt.MLP, rt.HID), "fc2_c": W(rt.HID, rt.MLP)}
            for p in "qkv":
                b[p] = W(rt.HID, rt.HID)
                b[p + "_c"] = W(rt.HID, rt.HID)[lo:hi].contiguous()
            for n in ("nq", "nk", "nq_c", "nk_c"):
                b[n] = torch.ones(rt.HD, device=rt.dev, dtype=rt.DT)
            self.double.append(b)
        self.single = []
        for _ in range(rt.SINGLE):
            b = {"mod": W(3 * rt.HID, rt.HID), "proj_mlp": W(rt.MLP, rt.HID), "proj_out": W(rt.HID, rt.HID + rt.MLP)}
            for p in "qkv":
                b[p] = W(rt.HID, rt.HID)
                b[p + "_c"] = W(rt.HID, rt.HID)[lo:hi].contiguous()
            for n in ("nq", "nk", "nq_c", "nk_c"):
                b[n] = torch.ones(rt.HD, device=rt.dev, dtype=rt.DT)
            self.single.append(b)
        self.x_emb, self.ctx_emb = W(rt.HID, 64), W(rt.HID, 4096 if not rt.CPU else 32)
        self.t1, self.t2 = W(rt.HID, 256), W(rt.HID, rt.HID)
        self.norm_out, self.proj_out = W(2 * rt.HID, rt.HID), W(64, rt.HID)


class Rope:
    def __init__(self, n):
        self.cos = torch.randn(n, 1, rt.HD, device=rt.dev, dtype=torch.float32)
        self.sin = torch.randn(n, 1, rt.HD, device=rt.dev, dtype=torch.float32)


class Step:
    """One denoising step of one rank: w ranks, strategy flags, `tokens` image tokens in all."""

    def __init__(self, model, tokens, strategy, group, exchange=None):
        self.m, self.n, self.group = model, tokens, group
        self.w, self.rank, self.hl = model.w, model.rank, model.hl
        self.n_loc = tokens // self.w
        # exchange: every multi-GPU step; one GPU's too with --one-rank-exchange (over `group`)
        self.exchange = self.w > 1 if exchange is None else exchange
        self.v_first = strategy in ("v_first", "cocodiff")
        self.chunks = 2 if strategy in ("pipeline", "cocodiff") and self.hl >= 2 else 1
        self.rope_img = Rope(self.n_loc)
        self.rope_txt = Rope(rt.TXT)
        self.x = torch.randn(self.n_loc, 64, device=rt.dev, dtype=rt.DT)
        self.text = torch.randn(rt.TXT, 4096 if not rt.CPU else 32, device=rt.dev, dtype=rt.DT)
        self.tfreq = torch.randn(1, 256, device=rt.dev, dtype=rt.DT)
        self.spans = None  # a list: every blocking exchange's device time (flat), by kind

    def span_start(self):
        if self.spans is None:
            return None
        sp = Span(torch.cuda.current_stream() if not rt.CPU else None)
        sp.start()
        return sp

    def span_issued(self, sp):
        if sp is not None:
            sp.host = time.perf_counter()  # the host has enqueued the exchange's kernel

    def span_stop(self, sp, kind):
        if sp is not None:
            sp.stop()
            self.spans.append((kind, sp))

    # Ulysses exchanges: to heads (this rank's tokens, every head -> every token, its heads)
    def a2a_async(self, send):
        recv = torch.empty_like(send)
        if rt.args.exchange_copy:
            recv.copy_(send)
            return recv, None
        work = dist.all_to_all_single(recv, send, group=self.group, async_op=True)
        return recv, work

    def attend(self, hi, hc, b, single):
        """Q, K, V of the image stream (sharded) and text (replicated, this rank's heads), as
        sp_attention.cpp orders and overlaps them; returns the image and text outputs."""
        parts_img, parts_txt = self.to_heads(hi, hc, b)
        o_img, o_txt = self.attention(parts_img, parts_txt)
        return self.to_tokens(o_img, o_txt)

    def to_heads(self, hi, hc, b):
        """Q, K and V projected, normed and roped; the image's exchanged to heads (in head groups
        when pipelined), waited for. Returns {part: [received groups]} and {part: text}."""
        w, hl, n_loc = self.w, self.hl, self.n_loc
        order = "vqk" if self.v_first else "qkv"
        parts_img, parts_txt, pending = {}, {}, []
        for part in order:
            # text: this rank's heads over every text token, no exchange
            t = F.linear(hc, b[part + "_c"]).view(rt.TXT, hl, rt.HD)
            if part != "v":
                t = rope(rms(t, b["n" + part + "_c"]), self.rope_txt.cos, self.rope_txt.sin)
            parts_txt[part] = t
            x = F.linear(hi, b[part]).view(n_loc, w, hl, rt.HD)
            if not self.exchange:
                if part != "v":
                    x = rope(rms(x, b["n" + part]), self.rope_img.cos.unsqueeze(1), self.rope_img.sin.unsqueeze(1))
                parts_img[part] = [x.view(n_loc, hl, rt.HD)]
                continue
            if part == "v" or self.chunks == 1:
                if part != "v":
                    x = rope(rms(x, b["n" + part]), self.rope_img.cos.unsqueeze(1), self.rope_img.sin.unsqueeze(1))
                send = x.transpose(0, 1).contiguous()
                blocking = not self.v_first and (part == "v" or self.chunks == 1)
                sp = self.span_start() if blocking else None
                recv, work = self.a2a_async(send)
                self.span_issued(sp)
                pending.append(work)
                parts_img[part] = [recv]
                if blocking:
                    for wk in pending:
                        waited(wk)
                    pending = []
                    self.span_stop(sp, "to_heads")
                continue
            chunks = []
            for c in range(self.chunks):
                h0, h1 = hl * c // self.chunks, hl * (c + 1) // self.chunks
                xc = rope(rms(x[:, :, h0:h1], b["n" + part]), self.rope_img.cos.unsqueeze(1),
                          self.rope_img.sin.unsqueeze(1))
                recv, work = self.a2a_async(xc.transpose(0, 1).contiguous())
                pending.append(work)
                chunks.append(recv)
            parts_img[part] = chunks
        for wk in pending:
            waited(wk)
        return parts_img, parts_txt

    def attention(self, parts_img, parts_txt):
        """Attention over the text and every rank's image tokens, this rank's heads: the image
        output [n, hl * dh] rows, and the text's [TXT, hl * dh]."""
        w, hl, n_loc = self.w, self.hl, self.n_loc
        qkv = []
        for part in "qkv":
            img = parts_img[part]
            img = img[0] if len(img) == 1 else torch.cat(img, dim=-2)  # [w, n_loc, hl, dh]
            img = img.reshape(w * n_loc, hl, rt.HD)  # every rank's tokens (n, less n mod w)
            qkv.append(torch.cat([parts_txt[part], img], 0).transpose(0, 1).unsqueeze(0))
        o = sdpa(*qkv)[0].transpose(0, 1)  # [TXT + n, hl, dh]
        o_txt, o_img = o[:rt.TXT].reshape(rt.TXT, hl * rt.HD), o[rt.TXT:]
        return o_img, o_txt

    def to_tokens(self, o_img, o_txt):
        """The image output exchanged back to this rank's tokens and the text's heads gathered."""
        w, hl, n_loc = self.w, self.hl, self.n_loc
        if not self.exchange:
            return o_img.reshape(n_loc, rt.HID), o_txt
        send = o_img.reshape(w, n_loc, hl * rt.HD).contiguous()
        recv = torch.empty_like(send)
        sp = self.span_start()
        if rt.args.exchange_copy:
            recv.copy_(send)
        else:
            dist.all_to_all_single(recv, send, group=self.group)  # back to tokens
        self.span_issued(sp)
        self.span_stop(sp, "to_tokens")
        out_img = recv.permute(1, 0, 2).reshape(n_loc, rt.HID)
        gathered = torch.empty(w, rt.TXT, hl * rt.HD, device=rt.dev, dtype=rt.DT)
        o_txt = o_txt.contiguous().view(-1)
        sp = self.span_start()
        if rt.args.exchange_copy:
            gathered.view(-1).copy_(o_txt)
        else:
            all_gather(gathered.view(-1), o_txt, self.group)
        self.span_issued(sp)
        self.span_stop(sp, "text_gather")
        out_txt = gathered.permute(1, 0, 2).reshape(rt.TXT, rt.HID)
        return out_img, out_txt

    def double_block(self, b, x, c, temb):
        mi = F.linear(temb, b["mod_img"]).chunk(6, -1)
        mt = F.linear(temb, b["mod_txt"]).chunk(6, -1)
        hi = norm_mod(x, mi[0], mi[1])
        hc = norm_mod(c, mt[0], mt[1])
        oi, ot = self.attend(hi, hc, b, False)
        x = x + mi[2] * F.linear(oi, b["out"])
        x = x + mi[5] * F.linear(gelu(F.linear(norm_mod(x, mi[3], mi[4]), b["fc1"])), b["fc2"])
        c = c + mt[2] * F.linear(ot, b["add_out"])
        c = c + mt[5] * F.linear(gelu(F.linear(norm_mod(c, mt[3], mt[4]), b["fc1_c"])), b["fc2_c"])
        return x, c

    def single_block(self, b, x, c, temb):
        m = F.linear(temb, b["mod"]).chunk(3, -1)
        hc = norm_mod(c, m[0], m[1])
        fc = gelu(F.linear(hc, b["proj_mlp"]))
        hi = norm_mod(x, m[0], m[1])
        fi = gelu(F.linear(hi, b["proj_mlp"]))
        oi, ot = self.attend(hi, hc, b, True)
        c = c + m[2] * F.linear(torch.cat([ot, fc], -1), b["proj_out"])
        x = x + m[2] * F.linear(torch.cat([oi, fi], -1), b["proj_out"])
        return x, c

    def __call__(self):
        m = self.m
        x = F.linear(self.x, m.x_emb)
        c = F.linear(self.text, m.ctx_emb)
        temb = F.silu(F.linear(F.silu(F.linear(self.tfreq, m.t1)), m.t2))
        for b in m.double:
            x, c = self.double_block(b, x, c, temb)
        for b in m.single:
            x, c = self.single_block(b, x, c, temb)
        mo = F.linear(temb, m.norm_out).chunk(2, -1)
        v = F.linear(norm_mod(x, mo[1], mo[0]), m.proj_out)
        self.x = self.x + 0.01 * v  # the sampler's Euler update
        return self.x
