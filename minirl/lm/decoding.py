"""A lean Llama forward for sampling, on the model's own weights (``minirl.lm.sampling.sample`` uses it).

transformers' forward is general: it builds a 4-D mask, looks up an attention function, grows its KV cache by
concatenation and runs three projections where one would do. For the course's 0.87M-parameter model that machinery
is a good part of a sampling call (with finished rows leaving the batch as well, a GRPO batch of 16 x 8 completions
took 0.49 s here instead of 0.64 s). ``LlamaDecoder`` computes the same function with fewer operations:

- q, k and v come from one matrix product with the three weights stacked, gate and up from another;
- the KV cache is allocated ahead of the tokens and written in place, one column per step (no concatenation);
- a new token attends to the whole cache allocated so far, the positions not written yet masked out. Its two
  batched products then run on whole (U, K, L, D) blocks rather than on slices of the first S positions, and on this
  CPU that made them about twice as fast, although they read all L positions: attention went from 115 to 65 ms of a
  16 x 8 sampling call (346 -> 299 ms);
- the cache grows ``GROW`` positions at a time as tokens are written, up to the ``length`` it was built for, so a new
  token reads at most ``GROW`` - 1 unwritten positions instead of all that remain. Each growth copies the cache, but
  a short completion no longer streams the whole length's keys and values through the CPU's caches on every token.
  In three alternating comparisons a 16 x 8 GRPO sampling call took 274-295 ms here against 302-308 ms with the
  whole length allocated from the start, with the same tokens (growing 4 or 32 at a time gained less);
- beyond that, the attention mask is the prompts' padding only: every row attends to all of its completion tokens
  so far, as ``sample`` does, and a finished row's output is never read;
- the rows it holds are the caller's to choose, and ``fork`` appends a copy of a row without moving the others:
  ``sample`` holds one row per distinct prefix, each prompt once and the completions that have written the same
  tokens so far as one row (``minirl.lm.sampling``).

It reads the weights when it is built (``sample`` builds one per call), never copies the model's math into a second
set of parameters, and runs only where it computes transformers' Llama (up to float rounding): ``supports(model)``
says when (a ``LlamaForCausalLM`` with default rotary embeddings, no biases, SiLU and no forward hooks; the course's
model and SmolLM2 qualify). ``tests/test_lm_decoding.py`` checks its logits against the model's own forward, with and
without padding.

Shapes
    U   rows held, T   tokens in this call (the prompt, then 1), S   positions cached, L   positions the cache holds
    H   query heads, K   key/value heads, D   head size, E   hidden size, V   vocabulary
"""

import math

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM


def supports(model) -> bool:
    """True when ``LlamaDecoder`` computes what ``model``'s own forward does (up to float rounding)."""
    if type(model) is not LlamaForCausalLM:  # a subclass may change the forward
        return False
    if any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()):  # a hook would be skipped here
        return False
    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None) or {}
    return (
        rope.get("rope_type", "default") == "default"
        and not cfg.attention_bias
        and not cfg.mlp_bias
        and cfg.hidden_act == "silu"
        and getattr(cfg, "pretraining_tp", 1) == 1
    )


def distinct_rows(*columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows of ``columns`` (each (B, ...), read side by side): ``first`` (U,), a row index of each, and
    ``rows`` (B,), the index among the U of each row, so that ``x[first][rows]`` is ``x`` for any of the columns."""
    key = torch.cat([c.reshape(len(c), math.prod(c.shape[1:])).long() for c in columns], dim=1)  # (B, .)
    distinct, rows = torch.unique(key, dim=0, return_inverse=True)  # (U, .), (B,)
    first = torch.empty(len(distinct), dtype=torch.long, device=key.device)
    first[rows] = torch.arange(len(key), device=key.device)  # (U,) one row of each distinct key
    return first, rows


GROW = 8  # positions the KV cache gains at a time


class LlamaDecoder:
    """Next-token logits with a KV cache for up to ``batch`` rows of up to ``length`` tokens, grown ``GROW`` at a time.

    The caller decides which rows the cache holds: the first call (the prompt pass) caches its rows, ``fork(parents)``
    appends copies of some of them (rows that shared a prefix and now go on with different tokens) and
    ``select(rows)`` keeps only some. Every later call computes one new token for each row held, in that order."""

    def __init__(self, model: LlamaForCausalLM, batch: int, length: int, pad_mask: torch.Tensor | None):
        """``pad_mask``: (U, P) bool, False on the left padding of the prompts of the first call; None when no prompt
        is padded."""
        cfg, core = model.config, model.model
        self.H, self.K = cfg.num_attention_heads, cfg.num_key_value_heads
        self.D = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.H
        self.eps = cfg.rms_norm_eps
        self.embed, self.norm, self.head = core.embed_tokens.weight, core.norm.weight, model.lm_head.weight
        self.inv_freq = core.rotary_emb.inv_freq.float()  # (D/2,)
        self.layers = []
        for layer in core.layers:
            att, mlp = layer.self_attn, layer.mlp
            self.layers.append((
                layer.input_layernorm.weight,
                torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]),  # ((H + 2K) D, E)
                att.o_proj.weight,
                layer.post_attention_layernorm.weight,
                torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),  # (2 I, E)
                mlp.down_proj.weight,
            ))  # fmt: skip
        w = self.embed
        self.length, self.capacity = length, batch
        # Keys and values live in one block (2, layers, batch, K, L, D) with room for ``batch`` rows, of which the
        # first U are held: each layer's (U, K, L, D) is then one contiguous piece of memory, as the batched products
        # of attention need, and ``fork`` appends rows without moving the others. Growing the cache or dropping rows
        # rewrites it into the other of two buffers that can hold the largest block (L = length). The two are
        # allocated once, so growing allocates nothing: with a new zero-filled tensor per growth (the first touch of
        # fresh memory is slow), 500 greedy rows took 1.14-1.22 s here against 1.08-1.13 s in three alternating
        # comparisons (AMD EPYC, one thread), a 16 x 8 GRPO batch 308-325 ms against 295-320 ms.
        numel = 2 * len(self.layers) * batch * self.K * length * self.D
        self._buffers = [w.new_empty(numel), w.new_empty(numel)]
        self._held = 0  # the buffer the cache is in
        self._kv = self._block(0, 0)
        self.U, self.S = 0, 0  # rows held, positions written
        self.slots = torch.arange(length, device=w.device)  # (length,) cache positions
        self.keep = None  # (batch, 1, 1, length) bool, the prompts' real tokens (False on padding); None: no padding
        if pad_mask is not None:
            self.keep = torch.ones(batch, 1, 1, length, dtype=torch.bool, device=w.device)  # sliced to U and L
            self.keep[: len(pad_mask), 0, 0, : pad_mask.shape[1]] = pad_mask

    @property
    def k_cache(self) -> torch.Tensor:
        return self._kv[0, :, : self.U]  # (layers, U, K, L, D)

    @property
    def v_cache(self) -> torch.Tensor:
        return self._kv[1, :, : self.U]  # (layers, U, K, L, D)

    def _block(self, buffer: int, L: int) -> torch.Tensor:
        """The first numbers of ``self._buffers[buffer]`` as a contiguous (2, layers, batch, K, L, D) block."""
        shape = (2, len(self.layers), self.capacity, self.K, L, self.D)
        return self._buffers[buffer][: math.prod(shape)].view(shape)

    def _reserve(self, s1: int) -> None:
        """Grow the cache to hold at least ``s1`` positions: to ``s1`` + ``GROW`` - 1 or ``length``, new positions 0
        (finite: a masked position still multiplies its weight 0 by its value)."""
        L, U = self._kv.shape[4], self.U
        if s1 <= L:
            return
        if s1 > self.length:
            raise ValueError(f"the cache holds {self.length} positions, {s1} were asked for")
        self._held = 1 - self._held
        grown = self._block(self._held, min(self.length, s1 + GROW - 1))
        grown[:, :, :U, :, :L] = self._kv[:, :, :U]
        grown[:, :, :U, :, L:] = 0
        self._kv = grown

    def fork(self, parents: torch.Tensor) -> None:
        """Append a copy of each row ``parents`` (n,) names, after the U rows held: rows U .. U + n - 1."""
        U, n = self.U, len(parents)
        if U + n > self.capacity:
            raise ValueError(f"the cache has room for {self.capacity} rows, {U + n} were asked for")
        self._kv[:, :, U : U + n] = self._kv[:, :, parents]
        if self.keep is not None:
            self.keep[U : U + n] = self.keep[parents]
        self.U = U + n

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (U',) of the rows held, in that order, in the cache and the mask."""
        self._held = 1 - self._held
        kept = self._block(self._held, self._kv.shape[4])
        torch.index_select(self._kv, 2, rows, out=kept[:, :, : len(rows)])
        self._kv, self.U = kept, len(rows)
        if self.keep is not None:
            self.keep[: len(rows)] = self.keep[rows]

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary embedding (Su et al. 2021), transformers' half-split layout: x cos + rotate_half(x) sin."""
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T / sqrt(D)) v (Vaswani et al. 2017), the H / K query heads of a group sharing one key head.

        q: (U, H, T, D); k, v: (U, K, S, D), the whole cache (S = L) for a new token. The prompt pass (T > 1) takes
        ``mask`` as None or a bool (U, 1, T, S), True where attended; a new token as an additive float ``bias``,
        (L,) or (U * K, 1, L), 0 where attended and -inf elsewhere (``_new_token_bias``).
        Returns (U, H, T, D). One new token (T = 1) takes two batched matrix products: under the profiler torch's
        fused attention kernel took 0.90 ms per call on 128 rows here, and these two 0.75 ms together. The first
        product adds the bias and scales in the same call (``baddbmm``): on an Intel Xeon that took attention from
        445 to 380 us per layer for 128 rows, against a product, a scaling and a ``masked_fill`` (a GRPO batch's
        sampling call: 0.242 to 0.225 s median there, 0.397 to 0.386 s on an AMD EPYC); the scores are the same
        numbers."""
        U, H, T, D = q.shape
        if T > 1:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.K != H)
        S = k.shape[2]
        q = q.reshape(U * self.K, H // self.K, D)  # (U K, H/K, D): query heads grouped by their key head
        k, v = k.reshape(U * self.K, S, D), v.reshape(U * self.K, S, D)  # (U K, S, D) each
        scores = torch.baddbmm(mask, q, k.transpose(1, 2), alpha=D**-0.5)  # (U K, H/K, S): bias + q k^T / sqrt(D)
        return (scores.softmax(dim=-1) @ v).view(U, H, 1, D)  # (U, H, 1, D)

    def _new_token_bias(self, s1: torch.Tensor | int) -> torch.Tensor:
        """The additive mask of a new token over the whole cache: 0 on the positions written so far (< ``s1``) that
        are not prompt padding, -inf elsewhere. (L,) without padding, else (U * K, 1, L), one row per key head."""
        L, U = self._kv.shape[4], self.U  # the positions the cache holds now, the rows
        mask = self.slots[:L] < s1  # (L,)
        if self.keep is not None:
            mask = (self.keep[:U, ..., :L] & mask).expand(U, self.K, 1, L).reshape(U * self.K, 1, L)  # (U K, 1, L)
        return torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, float("-inf"))

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits after the last of ``ids`` (U, T), with position ids ``pos`` (U, T); caches their keys and values.

        The first call (T > 1 or not) is the prompt pass and sets the rows held; every later call passes one token
        for each of them. Returns (U, V)."""
        U, T = ids.shape
        s0, s1 = self.S, self.S + T
        if s0 == 0:
            if U > self.capacity:
                raise ValueError(f"the cache has room for {self.capacity} rows, {U} were passed")
            self.U = U
        elif T != 1 or U != self.U:
            raise ValueError(f"after the prompts, one token for each of the {self.U} rows held, got {tuple(ids.shape)}")
        self._reserve(s1)
        h = F.embedding(ids, self.embed)  # (U, T, E)
        freqs = pos[..., None].float() * self.inv_freq  # (U, T, D/2)
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # (U, 1, T, D)
        cos, sin = emb.cos().to(h.dtype), emb.sin().to(h.dtype)
        if T > 1:  # the prompt: causal as well; a padding query also sees itself, so its softmax is never empty
            mask = None if self.keep is None else self.keep[:U, ..., :s1]  # (U, 1, 1, T)
            causal = torch.ones(T, T, dtype=torch.bool, device=h.device).tril()  # (T, T)
            mask = causal if mask is None else (mask & causal) | torch.eye(T, dtype=torch.bool, device=h.device)
        else:  # a new token: the positions written so far, less the padding, as one additive bias for all layers
            mask = self._new_token_bias(s1).to(h.dtype)  # (L,) or (U K, 1, L)
        for i, (w_in, w_qkv, w_o, w_post, w_gu, w_down) in enumerate(self.layers):
            x = F.rms_norm(h, (h.shape[-1],), w_in, self.eps)  # (U, T, E)
            qkv = (x @ w_qkv.T).view(U, T, self.H + 2 * self.K, self.D).transpose(1, 2)  # (U, H + 2K, T, D)
            qk = self._rope(qkv[:, : self.H + self.K], cos, sin)  # (U, H + K, T, D): q and k rotated together
            q, k, v = qk[:, : self.H], qk[:, self.H :], qkv[:, self.H + self.K :]  # (U, H | K | K, T, D)
            k_cache, v_cache = self._kv[0, i, :U], self._kv[1, i, :U]  # (U, K, L, D) each, contiguous
            k_cache[:, :, s0:s1] = k
            v_cache[:, :, s0:s1] = v
            if T == 1:  # a new token attends to the whole cache, masked; a prompt (T > 1) to its own keys
                k, v = k_cache, v_cache
            att = self._attend(q, k, v, mask)
            h = h + att.transpose(1, 2).reshape(U, T, -1) @ w_o.T  # (U, T, E)
            x = F.rms_norm(h, (h.shape[-1],), w_post, self.eps)
            gate, up = (x @ w_gu.T).chunk(2, dim=-1)  # (U, T, I) each
            h = h + (F.silu(gate) * up) @ w_down.T  # (U, T, E)
        self.S = s1
        last = F.rms_norm(h[:, -1], (h.shape[-1],), self.norm, self.eps)  # (U, E)
        return last @ self.head.T  # (U, V)
