"""ref_model.py - independent NumPy forward pass of the GGUF models in docs/model-format.md.

Architectures llama, qwen2, qwen3 (q/k head norms) and gemma3 (q/k head norms, embeddings
by sqrt(dim), GeGLU, post-attention and post-ffn norms, sliding-window local layers with
their own rope base), as llama.cpp computes them.

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


def gelu_tanh(x):
    """the tanh approximation of gelu (gemma's, ggml's ggml_gelu)"""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "phi3")


class RefModel:
    def __init__(self, path):
        r = GGUFReader(path)
        self.arch = _field(r, "general.architecture")
        if self.arch not in ARCHS:
            raise ValueError(f"{path}: architecture {self.arch} is not one of {ARCHS}")
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
        if scaling not in ("none", "linear", "yarn"):
            raise ValueError(f"{path}: rope.scaling.type {scaling} is not none, linear or yarn")
        self.rope_factor = 1.0
        if scaling == "linear":
            self.rope_factor = float(_field(r, a + "rope.scaling.factor"))
        # the magnitude of every global rotation (YaRN's), 1 = none
        self.rope_mscale = 1.0
        yarn = None
        if scaling == "yarn":
            yarn = (float(_field(r, a + "rope.scaling.factor")),
                    int(_field(r, a + "rope.scaling.original_context_length",
                               _field(r, a + "context_length"))),
                    float(_field(r, a + "rope.scaling.attn_factor", 1.0)),
                    float(_field(r, a + "rope.scaling.yarn_log_multiplier", 0.1)))
        self.neox = self.arch != "llama"
        self.gemma = self.arch == "gemma3"
        # gemma3: layer il is local (a window of n_swa positions, rope base 10000, unscaled)
        # unless il % 6 == 5; scores scaled by query_pre_attn_scalar^-1/2 = key_length^-1/2
        # (the 27B, 62 layers: (dim / n_head)^-1/2), as llama.cpp does
        self.n_swa = int(_field(r, a + "attention.sliding_window")) if self.gemma else 0
        self.attn_scale = 1.0 / math.sqrt(self.head_dim)
        if self.gemma and self.n_layer == 62:
            self.attn_scale = 1.0 / math.sqrt(self.dim // self.n_head)

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
        if self.arch == "phi3" and "rope_factors_long.weight" in w:
            # LongRoPE at every position (the long factors, as llama.cpp with a context past
            # the original), cos and sin scaled by the attention factor
            self.rope_freqs = dequantize(w["rope_factors_long.weight"]).reshape(-1)
            orig = int(_field(r, a + "rope.scaling.original_context_length", 4096))
            ctx = int(_field(r, a + "context_length"))
            self.rope_mscale = float(_field(r, a + "rope.scaling.attn_factor",
                                            math.sqrt(1 + math.log(ctx / orig) / math.log(orig))))
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
                "q_norm": get("attn_q_norm.weight"),  # (head_dim,) qwen3, gemma3
                "k_norm": get("attn_k_norm.weight"),  # (head_dim,)
                "post_attn_norm": get("post_attention_norm.weight"),  # (dim,) gemma3
                "post_ffn_norm": get("post_ffw_norm.weight"),  # (dim,)
                "local": self.gemma and i % 6 != 5,
            }
            if self.arch == "phi3" and L["wq"] is None:
                # q, k, v rows in one matrix (Phi-3's qkv_proj, chunked so by the HF model)
                qkv = get("attn_qkv.weight")
                nq, nkv = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
                assert qkv.shape == (nq + 2 * nkv, self.dim), qkv.shape
                L["wq"], L["wk"], L["wv"] = qkv[:nq], qkv[nq:nq + nkv], qkv[nq + nkv:]
            if self.arch == "phi3" and L["w_gate"] is None:
                # gate rows then up rows in ffn_up (gate_up_proj)
                gate_up = L["w_up"]
                assert gate_up.shape == (2 * self.ffn, self.dim), gate_up.shape
                L["w_gate"], L["w_up"] = gate_up[:self.ffn], gate_up[self.ffn:]
            if self.arch in ("qwen3", "gemma3"):
                assert L["q_norm"].shape == L["k_norm"].shape == (self.head_dim,)
            if self.gemma:
                assert L["post_attn_norm"].shape == L["post_ffn_norm"].shape == (self.dim,)
            assert L["wq"].shape == (self.n_head * self.head_dim, self.dim), L["wq"].shape
            assert L["wk"].shape == (self.n_head_kv * self.head_dim, self.dim)
            assert L["w_down"].shape == (self.dim, self.ffn)
            self.layers.append(L)
        if yarn is not None:
            self._yarn(*yarn)

    def _yarn(self, factor, orig_ctx, attn_factor, log_mul):
        """YaRN as llama.cpp's rope_yarn (ext_factor 1, beta_fast 32, beta_slow 1): each pair's
        angle mixes the interpolated theta / factor and the original theta by a ramp over the
        pairs between the correction dims; cos and sin scaled by the magnitude"""
        n = self.rope_dim

        def corr_dim(n_turns):
            return n * math.log(orig_ctx / (n_turns * 2 * math.pi)) / (2 * math.log(self.rope_base))

        lo = max(0.0, math.floor(corr_dim(32.0)))
        hi = min(n - 1.0, math.ceil(corr_dim(1.0)))
        i = np.arange(n // 2, dtype=np.float64)
        ramp = 1.0 - np.clip((i - lo) / max(0.001, hi - lo), 0.0, 1.0)  # 1: extrapolate
        # theta = (theta_i / factor) (1 - ramp) + theta_i ramp, as a divisor of theta_i
        self.rope_freqs = self.rope_freqs / ((1.0 - ramp) / factor + ramp)
        self.rope_mscale = attn_factor * (1.0 + log_mul * math.log(factor))

    # --- batched path --------------------------------------------------------

    def _rope_of(self, L):
        """(base, factor) of a layer's rope: gemma3's local layers their own, unscaled"""
        return (10000.0, 1.0) if L["local"] else (self.rope_base, self.rope_factor)

    def _embed(self, tok):
        x = self.tok_embd[tok]
        return x * math.sqrt(self.dim) if self.gemma else x

    def _ffn(self, L, h):
        """the feed-forward of normed h (..., dim) -> (..., dim), before any post norm"""
        act = gelu_tanh if self.gemma else silu
        return (act(h @ L["w_gate"].T) * (h @ L["w_up"].T)) @ L["w_down"].T

    def _post(self, L, name, y):
        """gemma3 norms a sub-block's output before the residual add"""
        return rmsnorm(y, L[name], self.eps) if L[name] is not None else y

    def _rope_batched(self, x, pos, base=None, factor=None):
        """x (T, n_heads, head_dim) rotated by position; pos (T,)"""
        base = self.rope_base if base is None else base
        factor = self.rope_factor if factor is None else factor
        half = self.rope_dim // 2
        inv = base ** (-2.0 * np.arange(half) / self.rope_dim) / self.rope_freqs
        ang = (pos[:, None] / factor) * inv[None, :]  # (T, half)
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        cos, sin = cos * self.rope_mscale, sin * self.rope_mscale
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

    def logits(self, tokens, rows=None):
        """tokens (T,) -> logits (T, n_vocab), float64; rows: only those positions' logits"""
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        pos = np.arange(T, dtype=np.float64)
        group = self.n_head // self.n_head_kv
        x = self._embed(tokens)  # (T, dim)
        mask = np.triu(np.full((T, T), -np.inf), k=1)  # (T, T) causal
        if self.n_swa:
            # a local layer's query t reads keys s > t - n_swa only
            local_mask = mask + np.tril(np.full((T, T), -np.inf), k=-self.n_swa)
        for L in self.layers:
            h = rmsnorm(x, L["attn_norm"], self.eps)
            q, k, v = h @ L["wq"].T, h @ L["wk"].T, h @ L["wv"].T
            if L["bq"] is not None:
                q, k, v = q + L["bq"], k + L["bk"], v + L["bv"]
            q = q.reshape(T, self.n_head, self.head_dim)
            k = k.reshape(T, self.n_head_kv, self.head_dim)
            if L["q_norm"] is not None:  # each head normed before rope
                q, k = rmsnorm(q, L["q_norm"], self.eps), rmsnorm(k, L["k_norm"], self.eps)
            base, factor = self._rope_of(L)
            q = self._rope_batched(q, pos, base, factor)
            k = self._rope_batched(k, pos, base, factor)
            v = v.reshape(T, self.n_head_kv, self.head_dim_v)
            k = np.repeat(k, group, axis=1)  # (T, n_head, head_dim): head h uses kv h // group
            v = np.repeat(v, group, axis=1)
            s = np.einsum("thd,shd->hts", q, k) * self.attn_scale
            s = s + (local_mask if L["local"] else mask)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            att = np.einsum("hts,shd->thd", s, v).reshape(T, -1)  # (T, n_head*head_dim_v)
            x = x + self._post(L, "post_attn_norm", att @ L["wo"].T)
            h = rmsnorm(x, L["ffn_norm"], self.eps)
            x = x + self._post(L, "post_ffn_norm", self._ffn(L, h))
        if rows is not None:
            x = x[rows]
        return rmsnorm(x, self.output_norm, self.eps) @ self.output.T

    # --- naive path: one token at a time --------------------------------------

    def _rope_one(self, vec, p, base=None, factor=None):
        """vec (head_dim,) rotated for position p, one pair at a time"""
        base = self.rope_base if base is None else base
        factor = self.rope_factor if factor is None else factor
        out = vec.copy()
        half = self.rope_dim // 2
        for i in range(half):
            theta = (p / factor) * base ** (-2.0 * i / self.rope_dim)
            theta /= self.rope_freqs[i]
            c, s = math.cos(theta) * self.rope_mscale, math.sin(theta) * self.rope_mscale
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
            x = np.array(self._embed(int(tok)))
            for L, (kc, vc) in zip(self.layers, cache):
                h = rmsnorm(x, L["attn_norm"], self.eps)
                q, k, v = L["wq"] @ h, L["wk"] @ h, L["wv"] @ h
                if L["bq"] is not None:
                    q, k, v = q + L["bq"], k + L["bk"], v + L["bv"]
                hd, hv = self.head_dim, self.head_dim_v
                base, factor = self._rope_of(L)

                def head(vec, j, norm):
                    one = vec[j * hd : (j + 1) * hd]
                    if norm is not None:
                        one = one / math.sqrt(np.mean(one * one) + self.eps) * norm
                    return self._rope_one(one, p, base, factor)

                k = np.concatenate([head(k, j, L["k_norm"]) for j in range(self.n_head_kv)])
                kc.append(k)
                vc.append(v)
                # a local layer reads the last n_swa positions only
                first = max(0, p + 1 - self.n_swa) if L["local"] else 0
                heads = []
                for hq in range(self.n_head):
                    qh = head(q, hq, L["q_norm"])
                    kv = hq // group
                    scores = np.array([qh @ kr[kv * hd : (kv + 1) * hd] for kr in kc[first:]])
                    scores *= self.attn_scale
                    wts = np.exp(scores - scores.max())
                    wts /= wts.sum()
                    heads.append(sum(wt * vr[kv * hv : (kv + 1) * hv]
                                     for wt, vr in zip(wts, vc[first:])))
                x = x + self._post(L, "post_attn_norm", L["wo"] @ np.concatenate(heads))
                h = rmsnorm(x, L["ffn_norm"], self.eps)
                x = x + self._post(L, "post_ffn_norm", self._ffn(L, h))
            out.append(self.output @ rmsnorm(x, self.output_norm, self.eps))
        return np.stack(out)


if __name__ == "__main__":
    m = RefModel(sys.argv[1])
    ids = [int(t) for t in sys.argv[2].split(",")]
    last = m.logits(ids)[-1]
    top = np.argsort(-last)[:5]
    print(" ".join(f"{int(i)}:{last[i]:.6f}" for i in top))
