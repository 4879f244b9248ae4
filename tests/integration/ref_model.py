"""ref_model.py - independent NumPy forward pass of the GGUF models in docs/model-format.md.

Reads a GGUF with gguf.GGUFReader, dequantizes F32/F16/BF16/Q8_0 itself (the block
formats Q4_0..Q6_K, IQ4_NL, IQ4_XS with gguf.quants, the reference for them) and
computes logits in float64. Two paths that share only the weights:
  RefModel.logits(tokens)       batched: every position at once, causal mask
  RefModel.logits_naive(tokens) one token at a time with a KV cache, loops
                                over heads and rotation pairs
The C engine (worker/) implements the same contract; tests compare the two.

usage: python ref_model.py MODEL.gguf 1,2,3   prints the last position's top 5
"""

import math
import os
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader

BLOCK_TYPES = (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K,
               QT.Q6_K, QT.IQ4_NL, QT.IQ4_XS)
SUPPORTED_TYPES = (QT.F32, QT.F16, QT.BF16, QT.Q8_0) + BLOCK_TYPES

# where the tests find rkv's binaries: $RKV_TOP/$RKV_BUILD/bin
TOP = Path(os.environ.get("RKV_TOP", Path(__file__).resolve().parents[2]))
BUILD = TOP / os.environ.get("RKV_BUILD", "build")


def rkv_bin(name):
    """path of build/bin/<name>, or None when it is not built"""
    path = BUILD / "bin" / name
    return path if path.exists() else None


def dequantize(t):
    """tensor -> float64 array of numpy shape reversed(ne): (n_out, n_in) for matrices"""
    shape = tuple(reversed([int(x) for x in t.shape]))
    raw = np.asarray(t.data)
    if t.tensor_type == QT.F32:
        out = raw.astype(np.float64)
    elif t.tensor_type == QT.F16:
        out = raw.view(np.float16).astype(np.float64)
    elif t.tensor_type == QT.BF16:
        # bf16 is the high half of an f32
        u16 = np.ascontiguousarray(raw).view(np.uint16).astype(np.uint32)
        out = (u16 << 16).view(np.float32).astype(np.float64)
    elif t.tensor_type == QT.Q8_0:
        # blocks of 34 bytes along ne[0]: f16 scale d, then 32 int8 q; value = d*q
        blocks = np.ascontiguousarray(raw).reshape(-1, 34)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float64)  # (n_blocks, 1)
        q = blocks[:, 2:].copy().view(np.int8).astype(np.float64)  # (n_blocks, 32)
        out = d * q
    elif t.tensor_type in BLOCK_TYPES:
        from gguf.quants import dequantize as gguf_dequantize
        out = gguf_dequantize(np.ascontiguousarray(raw), t.tensor_type).astype(np.float64)
    else:
        raise ValueError(
            f"tensor {t.name} has type {t.tensor_type.name}, which the reference does not "
            f"support ({', '.join(x.name for x in SUPPORTED_TYPES)})"
        )
    return out.reshape(shape)


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise KeyError(f"missing GGUF key {key}")
        return default
    return f.contents()


def rmsnorm(x, w, eps):
    """x (..., dim) -> x / sqrt(mean(x^2) + eps) * w"""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


class RefModel:
    def __init__(self, path):
        r = GGUFReader(path)
        self.arch = _field(r, "general.architecture")
        if self.arch not in ("llama", "qwen2"):
            raise ValueError(f"{path}: architecture {self.arch} is not llama or qwen2")
        a = self.arch + "."
        self.n_layer = int(_field(r, a + "block_count"))
        self.dim = int(_field(r, a + "embedding_length"))
        self.ffn = int(_field(r, a + "feed_forward_length"))
        self.n_head = int(_field(r, a + "attention.head_count"))
        self.n_head_kv = int(_field(r, a + "attention.head_count_kv", self.n_head))
        self.eps = float(_field(r, a + "attention.layer_norm_rms_epsilon"))
        self.rope_base = float(_field(r, a + "rope.freq_base", 10000.0))
        self.head_dim = int(_field(r, a + "attention.key_length", self.dim // self.n_head))
        self.head_dim_v = int(_field(r, a + "attention.value_length", self.head_dim))
        self.rope_dim = int(_field(r, a + "rope.dimension_count", self.head_dim))
        scaling = _field(r, a + "rope.scaling.type", "none")
        if scaling not in ("none", "linear"):
            raise ValueError(f"{path}: rope.scaling.type {scaling} is not none or linear")
        self.rope_factor = 1.0
        if scaling == "linear":
            self.rope_factor = float(_field(r, a + "rope.scaling.factor"))
        self.neox = self.arch == "qwen2"

        w = {t.name: t for t in r.tensors}
        self.tok_embd = dequantize(w["token_embd.weight"])  # (n_vocab, dim)
        tokens = r.fields.get("tokenizer.ggml.tokens")
        self.n_vocab = len(tokens.data) if tokens is not None else self.tok_embd.shape[0]
        assert self.tok_embd.shape == (self.n_vocab, self.dim)
        # absent output.weight: the head is tied to the embedding
        self.output = dequantize(w["output.weight"]) if "output.weight" in w else self.tok_embd
        self.output_norm = dequantize(w["output_norm.weight"])  # (dim,)
        # llama3 rope scaling: each pair's frequency divided by its factor, (rope_dim / 2,)
        self.rope_freqs = (dequantize(w["rope_freqs.weight"]).reshape(-1)
                           if "rope_freqs.weight" in w else np.ones(self.rope_dim // 2))
        self.layers = []
        for i in range(self.n_layer):
            p = f"blk.{i}."

            def get(name, p=p):
                t = w.get(p + name)
                return dequantize(t) if t is not None else None

            L = {
                "attn_norm": get("attn_norm.weight"),  # (dim,)
                "wq": get("attn_q.weight"),  # (n_head*head_dim, dim)
                "wk": get("attn_k.weight"),  # (n_head_kv*head_dim, dim)
                "wv": get("attn_v.weight"),  # (n_head_kv*head_dim_v, dim)
                "bq": get("attn_q.bias"),
                "bk": get("attn_k.bias"),
                "bv": get("attn_v.bias"),
                "wo": get("attn_output.weight"),  # (dim, n_head*head_dim_v)
                "ffn_norm": get("ffn_norm.weight"),  # (dim,)
                "w_gate": get("ffn_gate.weight"),  # (ffn, dim)
                "w_up": get("ffn_up.weight"),  # (ffn, dim)
                "w_down": get("ffn_down.weight"),  # (dim, ffn)
            }
            assert L["wq"].shape == (self.n_head * self.head_dim, self.dim), L["wq"].shape
            assert L["wk"].shape == (self.n_head_kv * self.head_dim, self.dim)
            assert L["w_down"].shape == (self.dim, self.ffn)
            self.layers.append(L)

    # --- batched path --------------------------------------------------------

    def _rope_batched(self, x, pos):
        """x (T, n_heads, head_dim) rotated by position; pos (T,)"""
        half = self.rope_dim // 2
        inv = self.rope_base ** (-2.0 * np.arange(half) / self.rope_dim) / self.rope_freqs
        ang = (pos[:, None] / self.rope_factor) * inv[None, :]  # (T, half)
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = x.copy()
        if self.neox:
            a, b = x[..., :half], x[..., half : self.rope_dim]
            out[..., :half] = a * cos - b * sin
            out[..., half : self.rope_dim] = a * sin + b * cos
        else:
            a, b = x[..., 0 : self.rope_dim : 2], x[..., 1 : self.rope_dim : 2]
            out[..., 0 : self.rope_dim : 2] = a * cos - b * sin
            out[..., 1 : self.rope_dim : 2] = a * sin + b * cos
        return out

    def logits(self, tokens):
        """tokens (T,) -> logits (T, n_vocab), float64"""
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        pos = np.arange(T, dtype=np.float64)
        group = self.n_head // self.n_head_kv
        x = self.tok_embd[tokens]  # (T, dim)
        mask = np.triu(np.full((T, T), -np.inf), k=1)  # (T, T) causal
        for L in self.layers:
            h = rmsnorm(x, L["attn_norm"], self.eps)
            q, k, v = h @ L["wq"].T, h @ L["wk"].T, h @ L["wv"].T
            if L["bq"] is not None:
                q, k, v = q + L["bq"], k + L["bk"], v + L["bv"]
            q = self._rope_batched(q.reshape(T, self.n_head, self.head_dim), pos)
            k = self._rope_batched(k.reshape(T, self.n_head_kv, self.head_dim), pos)
            v = v.reshape(T, self.n_head_kv, self.head_dim_v)
            k = np.repeat(k, group, axis=1)  # (T, n_head, head_dim): head h uses kv h // group
            v = np.repeat(v, group, axis=1)
            s = np.einsum("thd,shd->hts", q, k) / math.sqrt(self.head_dim) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            att = np.einsum("hts,shd->thd", s, v).reshape(T, -1)  # (T, n_head*head_dim_v)
            x = x + att @ L["wo"].T
            h = rmsnorm(x, L["ffn_norm"], self.eps)
            x = x + (silu(h @ L["w_gate"].T) * (h @ L["w_up"].T)) @ L["w_down"].T
        return rmsnorm(x, self.output_norm, self.eps) @ self.output.T

    # --- naive path: one token at a time --------------------------------------

    def _rope_one(self, vec, p):
        """vec (head_dim,) rotated for position p, one pair at a time"""
        out = vec.copy()
        half = self.rope_dim // 2
        for i in range(half):
            theta = (p / self.rope_factor) * self.rope_base ** (-2.0 * i / self.rope_dim)
            theta /= self.rope_freqs[i]
            c, s = math.cos(theta), math.sin(theta)
            i0, i1 = (i, i + half) if self.neox else (2 * i, 2 * i + 1)
            out[i0] = vec[i0] * c - vec[i1] * s
            out[i1] = vec[i0] * s + vec[i1] * c
        return out

    def logits_naive(self, tokens):
        """same result as logits(), computed position by position with a KV cache"""
        group = self.n_head // self.n_head_kv
        cache = [([], []) for _ in self.layers]  # per layer: K rows, V rows per position
        out = []
        for p, tok in enumerate(tokens):
            x = self.tok_embd[int(tok)].copy()
            for L, (kc, vc) in zip(self.layers, cache):
                h = rmsnorm(x, L["attn_norm"], self.eps)
                q, k, v = L["wq"] @ h, L["wk"] @ h, L["wv"] @ h
                if L["bq"] is not None:
                    q, k, v = q + L["bq"], k + L["bk"], v + L["bv"]
                hd, hv = self.head_dim, self.head_dim_v
                k = np.concatenate(
                    [self._rope_one(k[j * hd : (j + 1) * hd], p) for j in range(self.n_head_kv)]
                )
                kc.append(k)
                vc.append(v)
                heads = []
                for hq in range(self.n_head):
                    qh = self._rope_one(q[hq * hd : (hq + 1) * hd], p)
                    kv = hq // group
                    scores = np.array([qh @ kr[kv * hd : (kv + 1) * hd] for kr in kc])
                    scores /= math.sqrt(hd)
                    wts = np.exp(scores - scores.max())
                    wts /= wts.sum()
                    heads.append(sum(wt * vr[kv * hv : (kv + 1) * hv] for wt, vr in zip(wts, vc)))
                x = x + L["wo"] @ np.concatenate(heads)
                h = rmsnorm(x, L["ffn_norm"], self.eps)
                x = x + L["w_down"] @ (silu(L["w_gate"] @ h) * (L["w_up"] @ h))
            out.append(self.output @ rmsnorm(x, self.output_norm, self.eps))
        return np.stack(out)


if __name__ == "__main__":
    m = RefModel(sys.argv[1])
    ids = [int(t) for t in sys.argv[2].split(",")]
    last = m.logits(ids)[-1]
    top = np.argsort(-last)[:5]
    print(" ".join(f"{int(i)}:{last[i]:.6f}" for i in top))
