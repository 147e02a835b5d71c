"""Batched sampling that records the policy's log-probs, and their recomputation (``notebooks/08_tiny_lm.ipynb``).

The language model is a policy: the state is the prompt plus the tokens so far, the action is the next token, and
the log-prob of a whole completion is the sum of its tokens' log-probs, log pi(o | q) = sum_t log pi(o_t | q, o_<t).

Shapes
    B   prompts (rows) in the batch; R' the rows still being written
    U   rows the model computes: one per distinct prefix of the rows still being written (``_Rows``)
    P   prompt tokens after left padding
    C   completion tokens, at most ``max_new_tokens``
    L   P + C, a whole row
    V   vocabulary

Prompts are padded on the LEFT, so that every row's last prompt token sits in the last column and the new tokens of
all rows are appended in the same column. Position ids count only real tokens (``positions``), so a row's numbers do
not depend on how much padding its neighbours forced on it.
"""

import math
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from minirl.lm import decoding
from minirl.lm.model import cache_kwarg, check_vocab

# A decode step's work below which it runs on one thread: 2 FLOPs per weight per row still being written. Such a step
# is a few dozen small operations, and a second thread costs more in waking and waiting than it saves. Measured on 2
# cores (AMD EPYC, the course's 0.87M-parameter model): 16 x 8 GRPO rows (0.22 GFLOP a step) sampled in 0.39 s on one
# thread against 0.46 s on two; 500 greedy rows (0.87 GFLOP a step) in 1.2-1.4 s on two against 1.4-1.5 s on one.
ONE_THREAD_FLOPS = 0.5e9

# On a CPU with two or more threads, a batch of at least 2 * SPLIT_ROWS distinct prompts whose halves' decode steps
# are below ONE_THREAD_FLOPS is sampled as two halves, each with its own forward and KV cache, in two Python threads of
# one torch thread each: a whole half of a decode step per core, instead of every small operation shared between
# threads that sleep between operations. A larger model keeps all threads on every operation. The noise of every step
# is still drawn for the whole batch, in order, before the halves run, and a row's numbers do not depend on the other
# rows of its matrix products (down to four rows: fewer take other kernels, which round differently), so the tokens are
# those of one batch up to such rounding. Python's lock lets the halves overlap only in part.
# Measured on 2 cores (AMD EPYC, the course's model, waiting threads asleep): a decode step of 128 rows took 4.5 ms
# against 5.9 ms on one thread and 7.7 ms on two, of 500 rows 17.0 ms against 25.1 and 30.8, of 64 rows 4.0 ms against
# 3.6 ms on one thread (so smaller batches stay whole); a whole call of 500 greedy rows 0.65-0.68 s against 0.69-0.96
# s. The rows are counted by distinct prompts because rows that share a prefix are computed once (``_Rows``): a 16 x 8
# GRPO batch (16 prompts) takes 0.21 s whole against 0.23-0.24 s as halves of 8 prompts.
SPLIT_ROWS = 48


@dataclass
class Samples:
    """What ``sample`` returns. Use ``ids`` and ``mask`` to recompute log-probs with ``logprobs``."""

    prompt_ids: torch.Tensor  # (B, P) left-padded with the pad id
    prompt_mask: torch.Tensor  # (B, P) bool, False on padding
    completion_ids: torch.Tensor  # (B, C) pad id after a row's eos
    completion_mask: torch.Tensor  # (B, C) bool, True up to AND including the eos token
    logp: torch.Tensor  # (B, C) log pi(o_t | q, o_<t) under the distribution sampled from; 0 where the mask is False
    truncated: torch.Tensor  # (B,) bool, True when a row reached max_new_tokens without an eos
    text: list[str]  # decoded completions without special tokens (the tags stay)

    @property
    def ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)  # (B, L)

    @property
    def mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)  # (B, L)


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip padding: 0, 1, 2, ... over a row's real tokens (padding gets 0, it is never used)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, L)


def _check_temperature(temperature: float) -> float:
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}; for greedy use greedy=True")
    return float(temperature)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature) at ``tokens``: (B, T, V) logits and (B, T) tokens -> (B, T)."""
    return torch.log_softmax(logits.float() / temperature, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)


def logprobs(model, ids: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log pi(ids_t | ids_<t) of the temperature-scaled softmax for every column t, in one forward pass, no cache.

    Args:
        ids: (B, L) token ids, a batch of prompt + completion rows (``Samples.ids``).
        mask: (B, L) True on real tokens (``Samples.mask``); padding is neither attended to nor scored.
        temperature: divide the logits by this before the softmax, as the sampler did.

    Returns:
        (B, L) log-probs; 0 at each row's first real token (it has no context) and on padding. Keeps the autograd
        graph, for training.
    """
    temperature = _check_temperature(temperature)
    if ids.shape != mask.shape or ids.dim() != 2:
        raise ValueError(f"ids and mask must both be (B, L), got {tuple(ids.shape)} and {tuple(mask.shape)}")
    mask = mask.bool()
    logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=positions(mask)).logits  # (B, L, V)
    logp = token_logprobs(logits[:, :-1], ids[:, 1:], temperature)  # (B, L-1), token t+1 given tokens <= t
    logp = torch.nn.functional.pad(logp, (1, 0))  # (B, L)
    scored = mask & (positions(mask) > 0)  # a row's first real token has no context to be scored in
    return torch.where(scored, logp, torch.zeros_like(logp))


def completion_logprobs(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """log pi(o_t | q, o_<t) of every completion token, each distinct row and each distinct prompt q computed once.
    Keeps the graph.

    A row that repeats another, prompt and completion, has the same log-probs: only the distinct rows go through the
    model, each copy gets its twin's numbers, and the backward pass sums the copies' gradients into the one
    computation. A GRPO policy that has found an answer writes it often: a fifth of the rows trained on in the first
    30 steps on addition were copies, and skipping them took a training step from 0.38 to 0.30 s here (AMD EPYC, one
    thread, the same losses up to rounding).

    GRPO writes G completions per prompt, so most rows of a batch repeat a prompt. Here each distinct prompt goes
    through the model once; its keys and values (with their graph) are copied to each of its rows, and the
    completions then run on top of them as on a KV cache. The backward pass sums the rows' gradients into the one
    copy, so a prompt's forward and backward passes cost one row's work instead of G rows'. Only the last prompt
    position's logits are scored, as no prompt token is. On a GRPO chunk of 32 addition rows (4 prompts, 42
    completion columns) a forward and backward pass took 125 ms here against 138 ms for ``logprobs`` on whole rows.
    The last completion column is scored but never fed, as no token after it reads it: one column of C less to
    compute, forward and backward (a 32-row chunk of 43 columns: 127.5 ms against 130.9 ms, the same numbers).

    Args:
        prompt_ids, prompt_mask: (B, P) left-padded prompts (``Samples.prompt_ids``, ``Samples.prompt_mask``).
        completion_ids, completion_mask: (B, C) completions, True up to and including the eos.

    Returns:
        (B, C) log-probs, 0 on padding: ``logprobs(model, ids, mask)[:, P:]`` of the same rows, up to float rounding
        (``tests/test_lm_sampling.py`` checks values and gradients, with and without repeated rows).
    """
    temperature = _check_temperature(temperature)
    if prompt_ids.shape != prompt_mask.shape or completion_ids.shape != completion_mask.shape:
        shapes = [tuple(x.shape) for x in (prompt_ids, prompt_mask, completion_ids, completion_mask)]
        raise ValueError(f"the prompts' ids and mask must both be (B, P), the completions' both (B, C), got {shapes}")
    prompt_mask, completion_mask = prompt_mask.bool(), completion_mask.bool()
    whole, copies = decoding.distinct_rows(prompt_ids, prompt_mask, completion_ids, completion_mask)  # (R,), (B,)
    if len(whole) < len(prompt_ids):  # a row repeated: each distinct row computed once, its log-probs copied
        distinct = (x[whole] for x in (prompt_ids, prompt_mask, completion_ids, completion_mask))
        return completion_logprobs(model, *distinct, temperature)[copies]  # (B, C)
    P, core = prompt_ids.shape[1], getattr(model, "module", model)  # the model itself, also when DDP wraps it
    first, rows = decoding.distinct_rows(prompt_ids, prompt_mask)  # (U,), (B,)
    cache, kwarg = DynamicCache(config=core.config), cache_kwarg(core)
    u_mask = prompt_mask[first]  # (U, P)
    u_logits = model(
        input_ids=prompt_ids[first],
        attention_mask=u_mask.long(),
        position_ids=positions(u_mask),
        use_cache=True,
        **{kwarg: cache},
    ).logits[:, -1]  # (U, V)
    logits = u_logits[rows, None]  # (B, 1, V): the logits before o_1
    if completion_ids.shape[1] > 1:  # the last token o_C is only scored: no later token reads it, so it is not fed
        cache.batch_select_indices(rows)  # each row its prompt's keys and values, (B, K, P, D) per layer
        mask = torch.cat([prompt_mask, completion_mask[:, :-1]], dim=1)  # (B, P + C - 1)
        after = model(
            input_ids=completion_ids[:, :-1],
            attention_mask=mask.long(),
            position_ids=positions(mask)[:, P:],
            use_cache=True,
            **{kwarg: cache},
        ).logits  # (B, C - 1, V): the logits before o_2 ... o_C
        logits = torch.cat([logits, after], dim=1)  # (B, C, V): the logits before each o_t
    logp = token_logprobs(logits, completion_ids, temperature)  # (B, C)
    return torch.where(completion_mask, logp, torch.zeros_like(logp))


def check_prompts(model, tokenizer, prompts: list[str], ids: torch.Tensor, mask: torch.Tensor, max_new: int) -> None:
    """Raise when a prompt cannot be completed faithfully: it holds text the vocabulary lacks (it would be read as the
    unknown token, and vanish from the decoded text), or it leaves fewer than ``max_new`` of the model's positions.

    Args:
        ids: (B, P) the prompts' token ids, left-padded; mask: (B, P) True on real tokens.
    """
    unk = tokenizer.unk_token_id
    if unk is not None:
        for row, prompt in enumerate(prompts):
            if not (ids[row][mask[row]] == unk).any():
                continue
            pieces = _unknown_pieces(tokenizer, prompt)  # without the unknown token written out on purpose
            if pieces or (pieces is None and tokenizer.unk_token not in prompt):
                raise ValueError(
                    f"prompt {row} ({prompt[:40]!r}) holds {pieces or 'text'} that the tokenizer's vocabulary lacks: "
                    f"it would become {tokenizer.unk_token!r} and the model would never see it. Remove or replace "
                    "them with text the tokenizer knows (the course's character tokenizer knows printable ASCII and "
                    "the newline)"
                )
    context = getattr(model.config, "max_position_embeddings", None)
    longest = int(mask.sum(dim=1).max())
    if context is not None and longest + max_new > context:
        row = int(mask.sum(dim=1).argmax())
        raise ValueError(
            f"prompt {row} is {longest} tokens long and max_new_tokens is {max_new}: together {longest + max_new}, "
            f"more than the model's {context} positions (max_position_embeddings). Shorten the prompt to at most "
            f"{context - max_new} tokens, or ask for fewer new tokens"
        )


def _unknown_pieces(tokenizer, prompt: str) -> list[str] | None:
    """The pieces of ``prompt`` that encode to the unknown token, other than the unknown token itself written out,
    found with a fast tokenizer's character offsets; None for a slow tokenizer, which has no offsets."""
    if not getattr(tokenizer, "is_fast", False):
        return None
    enc = tokenizer(prompt, return_offsets_mapping=True, add_special_tokens=False)
    spans = [prompt[a:b] for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]) if i == tokenizer.unk_token_id]
    return [piece for piece in spans if piece != tokenizer.unk_token]


class _CachedForward:
    """The model's own forward with transformers' KV cache, for models ``minirl.lm.decoding`` does not cover. Called
    with (ids (U, T), pos (U, T)) it returns the (U, V) logits after the last of ids; ``select(rows)`` and
    ``fork(parents)`` change the rows it holds, as ``decoding.LlamaDecoder``'s do."""

    def __init__(self, model, prompt_mask: torch.Tensor):
        self.model, self.kwarg = model, cache_kwarg(model)
        self.cache = DynamicCache(config=model.config)  # filled in place by every forward
        self.attn = prompt_mask.long()  # (U, P + t): the prompts' padding mask, then every token fed after them
        self.capacity = math.inf  # rows it can hold: transformers' cache grows as rows are added

    def __call__(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        if self.cache.get_seq_length():  # past the prompt, which the mask holds already: one new token per call
            self.attn = torch.cat([self.attn, torch.ones_like(self.attn[:, :1])], dim=1)
        out = self.model(input_ids=ids, attention_mask=self.attn, position_ids=pos, use_cache=True,
                         **{self.kwarg: self.cache})  # fmt: skip
        return out.logits[:, -1]

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.attn = self.attn[rows]

    def fork(self, parents: torch.Tensor) -> None:
        self.select(torch.cat([torch.arange(len(self.attn), device=parents.device), parents]))


def _forward(model, prompt_mask: torch.Tensor, rows: int, max_new: int):
    """The lean forward of ``minirl.lm.decoding`` for a plain Llama, with room for ``rows`` rows, else the model's
    own (``_CachedForward``). ``prompt_mask``: (U, P), the prompts of its first call."""
    P = prompt_mask.shape[1]
    if decoding.supports(model):
        return decoding.LlamaDecoder(model, rows, P + max_new, None if prompt_mask.all() else prompt_mask)
    return _CachedForward(model, prompt_mask)


class _Rows:
    """The sampler's state for the rows ``rows`` (a slice) of the batch: which of them wrote their eos (``done``;
    ``finished`` once all have), and their forward with its KV cache, which holds one row per distinct prefix.

    Rows that share a prefix (the G completions of a prompt, and completions that have written the same tokens so
    far) have the same next-token distribution, so the model computes it once for all of them (``node``: each row's
    row of the cache) and each row draws its own token from it with its own noise. Rows of a prefix that drew
    different tokens part: the first keeps the cache row and each other token gets a copy (``fork``). Rows never
    depend on each other, so the draws are those of every row computed on its own, up to the rounding of smaller
    matrix products (see ``sample``). On the committed model's GRPO batches of 16 x 8 addition prompts, the distinct
    prefixes were 55% of the rows still writing, summed over the steps of the first 30 training steps."""

    def __init__(self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new: int, rows: slice):
        """``prompt_ids``, ``prompt_mask``: (R, P), these rows' prompts."""
        self.rows = rows
        first, self.node = decoding.distinct_rows(prompt_ids, prompt_mask)  # (U,), (R,): each prompt once
        self.forward = _forward(model, prompt_mask[first], len(prompt_ids), max_new)
        self.step_ids, self.pos = prompt_ids[first], positions(prompt_mask[first])  # (U, P) each, then (U, 1)
        self.done = torch.zeros(len(prompt_ids), dtype=torch.bool, device=prompt_ids.device)  # (R,)
        self.finished = False

    @property
    def computed(self) -> int:
        """The rows of the cache the next step computes."""
        return len(self.step_ids)

    @torch.no_grad()  # also in the second half's thread: autograd's switch is per thread
    def step(self, noise: torch.Tensor | None, temperature: float, top_k: int | None, eos: int, pad: int):
        """The next token of every row, its log-prob and whether the row was still running: (R,) each. A finished row
        writes pad with log-prob 0; ``noise`` (B, V) is the whole batch's, None for greedy."""
        done = self.done
        if self.finished:
            return torch.full_like(done, pad, dtype=torch.long), torch.zeros(len(done), device=done.device), ~done
        logits = self.forward(self.step_ids, self.pos).float() / temperature  # (U, V), one row per distinct prefix
        if top_k is not None and top_k < logits.shape[-1]:
            kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (U, 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))
        logp_all = torch.log_softmax(logits, dim=-1)  # (U, V)
        run = (~done).nonzero().squeeze(-1)  # (R',) the rows still writing
        node = self.node[run]  # (R',) the cache row of each
        if noise is None:
            tok_run = logits.argmax(dim=-1)[node]  # (R',)
        else:
            tok_run = (logp_all.exp()[node] / noise[self.rows][run]).argmax(dim=-1)  # (R',)
        tok = torch.full_like(done, pad, dtype=torch.long).index_put((run,), tok_run)  # (R,) finished rows only pad
        logp = torch.zeros(len(done), device=done.device).index_put((run,), logp_all[node, tok_run])  # (R,)
        self.done = done | (tok == eos)
        self.finished = bool(self.done.all())
        if not self.finished:
            self._advance(run[tok_run != eos], tok, logits.shape[-1], pad)
        return tok, logp, ~done

    def _advance(self, going: torch.Tensor, tok: torch.Tensor, V: int, pad: int) -> None:
        """The cache rows of the next step: one per distinct (prefix, token) of the rows ``going`` (R'',) on.

        The prefixes that no row goes on from are dropped once they make up a quarter of the rows computed (each
        drop copies the cache, so they leave in groups rather than one eos at a time); until then they are fed pad."""
        pairs, which = torch.unique(self.node[going] * V + tok[going], return_inverse=True)  # (N,), (R'',)
        parent, token = pairs // V, pairs % V  # (N,) each, sorted by parent, then token
        first = torch.ones_like(parent, dtype=torch.bool)  # (N,) the first token of each parent keeps its row
        first[1:] = parent[1:] != parent[:-1]
        U, pos = self.computed, self.pos[:, -1:] + 1  # (U, 1)
        kept = parent[first]  # (A,) the prefixes some row goes on from, ascending
        n_forks = len(parent) - len(kept)
        if len(kept) <= 0.75 * U or U + n_forks > self.forward.capacity:
            self.forward.select(kept)
            moved = torch.empty(U, dtype=torch.long, device=kept.device)
            moved[kept] = torch.arange(len(kept), device=kept.device)  # (U,) new index of each kept row
            parent, pos, U = moved[parent], pos[kept], len(kept)
        forks = ~first
        if n_forks:
            self.forward.fork(parent[forks])  # rows U .. U + n_forks - 1
        row = parent.clone()  # (N,) the cache row of each pair
        row[forks] = torch.arange(U, U + n_forks, device=row.device)
        self.step_ids = torch.full((U + n_forks, 1), pad, dtype=torch.long, device=row.device)
        self.step_ids[row, 0] = token  # (U', 1) a prefix no row goes on from is fed pad
        self.pos = torch.cat([pos, pos[parent[forks]]])  # (U', 1)
        self.node[going] = row[which]


@torch.no_grad()
def sample(
    model,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    greedy: bool = False,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> Samples:
    """Complete every prompt, one token at a time with a KV cache, until eos or ``max_new_tokens``.

    Each step samples from softmax(logits / temperature), restricted to the ``top_k`` most likely tokens when given,
    and records the log-prob of the token drawn under that same distribution. With ``top_k`` those log-probs are of
    the truncated distribution, which ``logprobs`` does not reproduce: the RL trainers sample with temperature only.
    ``greedy=True`` takes the most likely token instead and records its log-prob at ``temperature``.
    Randomness comes from ``generator``, or from a new one seeded with ``seed``, or from torch's global generator.
    """
    if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError(f"prompts must be a non-empty list of strings, got {prompts!r}")
    if not all(isinstance(p, str) for p in prompts):
        raise TypeError("prompts must be a list of strings")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    temperature = _check_temperature(temperature)
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or a positive integer, got {top_k!r}")
    if seed is not None and generator is not None:
        raise ValueError("pass seed or generator, not both")
    check_vocab(model, tokenizer)
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer needs an eos and a pad token; minirl.lm.load sets pad to eos when it has none")

    device = next(model.parameters()).device
    enc = tokenizer(list(prompts), padding=True, padding_side="left", return_tensors="pt")
    prompt_ids = enc["input_ids"].to(device)  # (B, P)
    prompt_mask = enc["attention_mask"].to(device).bool()  # (B, P)
    if not prompt_mask.any(dim=1).all():
        raise ValueError("a prompt encodes to no tokens (this tokenizer adds no bos); give every prompt some text")
    check_prompts(model, tokenizer, list(prompts), enc["input_ids"], prompt_mask.cpu(), max_new_tokens)
    if seed is not None:
        generator = torch.Generator(device).manual_seed(seed)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    batch = prompt_ids.shape[0]

    was_training = model.training
    model.eval()
    threads, n_weights = torch.get_num_threads(), sum(p.numel() for p in model.parameters())
    # two threads, half the rows each, when a half's decode step is too small to share between threads
    prompts_computed = len(decoding.distinct_rows(prompt_ids, prompt_mask)[0])  # the rows of the first step
    halves = (device.type == "cpu" and threads >= 2 and prompts_computed >= 2 * SPLIT_ROWS
              and n_weights * batch < ONE_THREAD_FLOPS)  # fmt: skip
    shares = [slice(0, batch // 2), slice(batch // 2, batch)] if halves else [slice(0, batch)]
    V = model.config.vocab_size
    pool = ThreadPoolExecutor(1, initializer=torch.set_num_threads, initargs=(1,)) if halves else nullcontext()
    try:
        with pool:  # the second half's thread, one torch thread
            if halves:
                torch.set_num_threads(1)
            parts = [_Rows(model, prompt_ids[rows], prompt_mask[rows], max_new_tokens, rows) for rows in shares]
            tokens, masks, logps = [], [], []
            for _ in range(max_new_tokens):
                # The exponential race, as torch.multinomial draws one sample: argmax_v p_v / E_v, E_v ~ Exp(1)
                # independent, is v with probability p_v. Noise for every row, computed or not, keeps each row's draw
                # independent of when its neighbours finished, and of which half it is in.
                noise = None if greedy else torch.empty(batch, V, device=device).exponential_(generator=generator)
                if halves:
                    other = pool.submit(parts[1].step, noise, temperature, top_k, eos, pad)
                    steps = [parts[0].step(noise, temperature, top_k, eos, pad), other.result()]
                else:
                    small = device.type == "cpu" and 2 * n_weights * parts[0].computed < ONE_THREAD_FLOPS
                    if torch.get_num_threads() != (1 if small else threads):  # too small to share
                        torch.set_num_threads(1 if small else threads)
                    steps = [parts[0].step(noise, temperature, top_k, eos, pad)]
                tok, logp, running = steps[0] if len(steps) == 1 else (torch.cat(x) for x in zip(*steps))  # (B,) each
                tokens.append(tok)
                masks.append(running)  # still running at this step: the eos itself is inside the mask
                logps.append(logp)
                if all(part.finished for part in parts):
                    break
    finally:
        torch.set_num_threads(threads)
        model.train(was_training)

    completion_ids = torch.stack(tokens, dim=1)  # (B, C)
    completion_mask = torch.stack(masks, dim=1)  # (B, C)
    rows = [row[m].tolist() for row, m in zip(completion_ids, completion_mask)]
    return Samples(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        logp=torch.stack(logps, dim=1),  # (B, C)
        truncated=~torch.cat([part.done for part in parts]),
        text=tokenizer.batch_decode(rows, skip_special_tokens=True),
    )
