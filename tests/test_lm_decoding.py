"""The lean sampling forward (``minirl.lm.decoding``) against the model's own forward, and the sampler on both."""

import threading

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from minirl.lm import PRETRAINED, build_tokenizer, decoding, load, logprobs, sample, sampling
from minirl.lm.sampling import positions

PROMPTS = ["1+1=", "347+585=", "9", "sort 42 7 88 15="]
# sums of 1, 2 and 3 digits for the committed model, which learned 3-digit sums: its completions stop anywhere from
# about 10 to 50 tokens at temperature T, so rows leave the batch early, while the others still have most of their
# tokens to write (reversing the kept rows in ``select`` changed 11 of the 22 rows)
T = 1.5
MIXED = [f"{a % 10}+{b % 10}=" if i % 3 == 1 else f"{a % 90 + 10}+{b % 90 + 10}=" if i % 3 == 2 else f"{a}+{b}="
         for i, (a, b) in enumerate(zip(range(105, 999, 41), range(961, 100, -39)))]  # fmt: skip


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def llama(tok, **changes) -> LlamaForCausalLM:
    cfg = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=4, max_position_embeddings=64, tie_word_embeddings=True, pad_token_id=0,
               bos_token_id=1, eos_token_id=2)  # fmt: skip
    cfg.update(changes)
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**cfg)).eval()


def decoded_logits(model, ids, mask, P):
    """The decoder's logits after each token from the prompt's last on: (B, L - P + 1, V)."""
    dec = decoding.LlamaDecoder(model, ids.shape[0], ids.shape[1], None if mask[:, :P].all() else mask[:, :P])
    pos = positions(mask)
    out = [dec(ids[:, :P], pos[:, :P])]
    out += [dec(ids[:, t : t + 1], pos[:, t : t + 1]) for t in range(P, ids.shape[1])]
    return torch.stack(out, dim=1)


@pytest.mark.parametrize(
    "changes",
    [{}, {"num_key_value_heads": 2}, {"num_key_value_heads": 1, "rope_parameters": {"rope_type": "default",
                                                                                     "rope_theta": 500000.0}}],
    ids=["heads", "grouped-query", "one-kv-head-rope-theta"],
)
@pytest.mark.parametrize("padded", [True, False])
def test_decoder_logits_are_the_models(tok, changes, padded):
    model = llama(tok, **changes)
    assert decoding.supports(model)
    prompts = PROMPTS if padded else ["12+34=", "56+78="]
    enc = tok(prompts, padding=True, padding_side="left", return_tensors="pt")
    P = enc["input_ids"].shape[1]
    # 19 new tokens: the cache grows twice by decoding.GROW = 8 positions, the second time only up to its length
    completion = torch.randint(3, len(tok), (len(prompts), 19), generator=torch.Generator().manual_seed(0))
    ids = torch.cat([enc["input_ids"], completion], dim=1)  # (B, L)
    mask = torch.cat([enc["attention_mask"].bool(), torch.ones_like(completion, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask.long(), position_ids=positions(mask)).logits  # (B, L, V)
    got = decoded_logits(model, ids, mask, P)
    torch.testing.assert_close(got, expected[:, P - 1 :], atol=1e-5, rtol=1e-5)


def test_forked_rows_go_on_from_their_parents_keys_and_values(tok):
    """Three prompts of different lengths (left padding) computed once, forked into six rows (two groups share a
    prompt), one token each, and one row forked again after its token: every row's logits are the model's on its own
    whole row."""
    model = llama(tok, num_key_value_heads=2)
    enc = tok(PROMPTS[1:4], padding=True, padding_side="left", return_tensors="pt")
    pids, pmask = enc["input_ids"], enc["attention_mask"].bool()  # (3, P) each
    P = pids.shape[1]
    dec = decoding.LlamaDecoder(model, 7, P + 2, pmask)
    first = dec(pids, positions(pmask))  # (3, V)
    dec.fork(torch.tensor([0, 2, 0]))  # rows 3, 4, 5 copy rows 0, 2, 0
    prompt_of = [0, 1, 2, 0, 2, 0, 1]  # each row's prompt; row 6 will be forked from row 1
    t1 = torch.tensor([5, 6, 7, 8, 9, 10])  # (6,)
    pos = positions(pmask)[prompt_of[:6], -1:] + 1  # (6, 1)
    second = dec(t1[:, None], pos)  # (6, V)
    dec.fork(torch.tensor([1]))  # row 6: row 1's prompt and token 6
    t2 = torch.tensor([11, 12, 13, 14, 15, 16, 17])  # (7,)
    third = dec(t2[:, None], torch.cat([pos, pos[1:2]]) + 1)  # (7, V)
    assert dec.U == 7
    with pytest.raises(ValueError, match="room for 7 rows"):
        dec.fork(torch.tensor([0]))
    written = torch.stack([torch.cat([t1, t1[1:2]]), t2], dim=1)  # (7, 2) each row's two tokens
    ids = torch.cat([pids[prompt_of], written], dim=1)  # (7, P + 2)
    mask = torch.cat([pmask[prompt_of], torch.ones_like(written, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask.long(), position_ids=positions(mask)).logits  # (7, P+2, V)
    torch.testing.assert_close(first, expected[:3, P - 1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(second, expected[:6, P], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(third, expected[:, P + 1], atol=1e-5, rtol=1e-5)


def test_the_cache_grows_by_blocks_up_to_its_length(tok):
    """The cache holds the positions written so far plus at most GROW - 1 more, never more than its length."""
    model = llama(tok)
    enc = tok(PROMPTS[:2], padding=True, padding_side="left", return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"].bool()
    P, L = ids.shape[1], ids.shape[1] + 20
    dec = decoding.LlamaDecoder(model, 2, L, mask)
    dec(ids, positions(mask))
    held = [dec.k_cache.shape[3]]
    for t in range(20):
        dec(torch.full((2, 1), 5), positions(mask)[:, -1:] + 1 + t)
        held.append(dec.k_cache.shape[3])
    G = decoding.GROW
    assert held == [min(L, P + G * (1 + t // G) - 1) for t in range(21)]
    assert dec.v_cache.shape == dec.k_cache.shape and dec.k_cache[:, :, :, P + 20 :].numel() == 0
    with pytest.raises(ValueError, match=f"holds {L} positions"):
        dec(torch.full((2, 1), 5), positions(mask)[:, -1:] + 21)


def test_the_cache_stays_in_its_two_buffers_and_unwritten_positions_are_zero(tok):
    """Growing and dropping rows rewrite the cache into the decoder's other buffer: no new memory, and every position
    not written yet reads 0 there (a buffer used before holds an older block at other offsets)."""
    model = llama(tok, num_key_value_heads=2)
    enc = tok(PROMPTS, padding=True, padding_side="left", return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"].bool()
    P = ids.shape[1]
    dec = decoding.LlamaDecoder(model, 4, P + 30, mask)
    dec(ids, positions(mask))
    starts = {b.data_ptr() for b in dec._buffers}
    pos, rows = positions(mask)[:, -1:] + 1, 4
    for t in range(30):
        if t in (5, 17):  # rows leave twice, between growths
            rows -= 1
            dec.select(torch.arange(rows))
            pos = pos[:rows]
        dec(torch.full((rows, 1), 5 + t % 7), pos + t)
        assert dec.k_cache.data_ptr() in starts and all(layer.is_contiguous() for layer in dec.k_cache)
        assert dec.k_cache.shape[1] == rows
        unwritten = torch.cat([dec.k_cache[:, :, :, dec.S :], dec.v_cache[:, :, :, dec.S :]])
        assert unwritten.eq(0).all(), f"token {t}: positions after {dec.S} hold stale numbers"


def test_select_keeps_the_chosen_rows(tok):
    """Rows dropped half-way leave the others' logits as they would be in a batch of their own."""
    model = llama(tok, num_key_value_heads=2)
    enc = tok(PROMPTS, padding=True, padding_side="left", return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"].bool()
    P, rows = ids.shape[1], torch.tensor([1, 3])
    nxt = torch.tensor([[5], [6], [7], [8]])
    dec = decoding.LlamaDecoder(model, 4, P + 2, mask)
    dec(ids, positions(mask))
    dec.select(rows)
    pos = positions(mask)[rows, -1:] + 1
    got = dec(nxt[rows], pos)
    alone = decoding.LlamaDecoder(model, 2, P + 2, mask[rows])
    alone(ids[rows], positions(mask[rows]))
    torch.testing.assert_close(got, alone(nxt[rows], pos), atol=1e-6, rtol=0)


def test_supports_only_what_it_computes(tok):
    assert decoding.supports(llama(tok))
    assert not decoding.supports(llama(tok, attention_bias=True))
    assert not decoding.supports(llama(tok, mlp_bias=True))
    assert not decoding.supports(llama(tok, hidden_act="gelu"))
    scaled = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert not decoding.supports(llama(tok, rope_parameters=scaled))
    hooked = llama(tok)
    hooked.lm_head.register_forward_hook(lambda module, args, logits: logits + 1)
    assert not decoding.supports(hooked), "a forward hook changes the function: the model's own forward runs it"


def same_rows(a: torch.Tensor, b: torch.Tensor, pad: int) -> torch.Tensor:
    """(B,) True where two (B, C) completions agree token for token (the shorter padded with ``pad``).

    Two forwards that differ in float rounding (1e-5 here) can, rarely, draw another token where a draw falls on a
    boundary between two, or break a near-tie under greedy. A row that diverges stays apart (its noise is its own), so
    the tests below allow one such row in 22 and check all the others token for token; a wrong row mapping would
    scramble many."""
    width = max(a.shape[1], b.shape[1])
    a, b = (torch.nn.functional.pad(x, (0, width - x.shape[1]), value=pad) for x in (a, b))
    return (a == b).all(dim=1)


@pytest.mark.parametrize("greedy", [False, True])
def test_the_sampler_writes_the_same_with_either_forward(tok, monkeypatch, greedy):
    """The committed model on sums of 1 to 3 digits: rows stop at different lengths, so finished rows leave the batch
    on the way. The lean forward and the model's own (with transformers' cache) draw the same tokens with the same
    log-probs."""
    model, tokenizer = load(PRETRAINED, device="cpu")
    prompts = MIXED  # left-padded to the longest
    lean = sample(model, tokenizer, prompts, 50, temperature=T, greedy=greedy, seed=11)
    monkeypatch.setattr(decoding, "supports", lambda model: False)
    plain = sample(model, tokenizer, prompts, 50, temperature=T, greedy=greedy, seed=11)
    lengths = lean.completion_mask.sum(1)
    assert greedy or lengths.max() - lengths.min() >= 20, "sampled rows should stop far apart, some leaving early"
    same = same_rows(lean.completion_ids, plain.completion_ids, tokenizer.pad_token_id)  # (B,)
    assert same.sum() >= len(prompts) - 1, same
    assert [t for t, s in zip(lean.text, same) if s] == [t for t, s in zip(plain.text, same) if s]
    if lean.logp.shape == plain.logp.shape:
        torch.testing.assert_close(lean.logp[same], plain.logp[same], atol=2e-5, rtol=0)
    recomputed = logprobs(model, lean.ids, lean.mask, temperature=T).detach()[:, lean.prompt_ids.shape[1] :]
    torch.testing.assert_close(lean.logp, recomputed, atol=5e-5, rtol=0)


def plain_draws(model, tokenizer, prompts: list[str], steps: int, temperature: float, seed: int) -> torch.Tensor:
    """The plainest sampler: every row through an uncached forward at every step, ``torch.multinomial`` on the whole
    batch. Returns the (B, C) completions, pad after each eos."""
    enc = tokenizer(prompts, padding=True, padding_side="left", return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"].bool()
    generator, done, eos = torch.Generator().manual_seed(seed), torch.zeros(len(prompts), dtype=torch.bool), 2
    for _ in range(steps):
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=positions(mask)).logits[:, -1]
        nxt = torch.multinomial((logits / temperature).softmax(-1), 1, generator=generator).squeeze(-1)
        nxt = torch.where(done, tokenizer.pad_token_id, nxt)
        ids, mask = torch.cat([ids, nxt[:, None]], 1), torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        done |= nxt == eos
        if done.all():
            break
    return ids[:, enc["input_ids"].shape[1] :]


def test_the_sampler_draws_what_a_plain_multinomial_loop_draws():
    """Same generator, same tokens: leaving finished rows out changes neither the draws nor their order."""
    model, tokenizer = load(PRETRAINED, device="cpu")
    got = sample(model, tokenizer, MIXED, 50, temperature=T, seed=11)
    same = same_rows(got.completion_ids, plain_draws(model, tokenizer, MIXED, 50, T, 11), tokenizer.pad_token_id)
    assert same.sum() >= len(MIXED) - 1, same


GROUPS = [prompt for prompt in MIXED[:6] for _ in range(8)]  # 6 prompts x 8 rows, as GRPO samples them


@pytest.mark.parametrize("lean", [True, False])
def test_rows_that_share_a_prefix_are_computed_once_and_draw_their_own_tokens(monkeypatch, lean):
    """The rows of a prompt have the same prefix until their draws part: the forward computes fewer rows than are
    writing (each prompt once in the prompt pass), and the tokens are those of the plain loop, which computes every
    row on its own. With the lean forward and with the model's own."""
    model, tokenizer = load(PRETRAINED, device="cpu")
    computed = []  # rows through the forward at each call
    if lean:
        real = decoding.LlamaDecoder.__call__
        monkeypatch.setattr(decoding.LlamaDecoder, "__call__", lambda self, ids, pos: computed.append(len(ids)) or
                            real(self, ids, pos))  # fmt: skip
    else:
        monkeypatch.setattr(decoding, "supports", lambda model: False)
        hook = model.register_forward_pre_hook(lambda _, args, kwargs: computed.append(len(kwargs["input_ids"])),
                                               with_kwargs=True)  # fmt: skip
    got = sample(model, tokenizer, GROUPS, 50, temperature=1.0, seed=3)
    if not lean:
        hook.remove()  # the plain loop below runs the same model
    writing = got.completion_mask.sum(dim=0)  # (C,) rows writing each column
    assert computed[0] == 6 and len(computed) == len(writing)
    assert sum(computed[1:]) < 0.8 * writing[1:].sum(), (computed, writing)
    same = same_rows(got.completion_ids, plain_draws(model, tokenizer, GROUPS, 50, 1.0, 3), tokenizer.pad_token_id)
    assert same.sum() >= len(GROUPS) - 1, same
    recomputed = logprobs(model, got.ids, got.mask).detach()[:, got.prompt_ids.shape[1] :]
    torch.testing.assert_close(got.logp, recomputed, atol=5e-5, rtol=0)


@pytest.mark.parametrize("greedy", [False, True])
def test_two_halves_on_two_threads_draw_what_one_batch_draws(monkeypatch, two_threads, greedy):
    """With two threads, a batch of at least 2 * SPLIT_ROWS rows is sampled as two halves, one per thread: the same
    tokens, log-probs and truncation as the whole batch on one thread, each half at one torch thread, and the caller's
    thread count back afterwards."""
    model, tokenizer = load(PRETRAINED, device="cpu")
    whole = sample(model, tokenizer, MIXED, 50, temperature=T, greedy=greedy, seed=11)  # 22 rows, not split
    seen = []  # (thread, torch threads) at each half's step
    real = sampling._Rows.step

    def watched(self, *args):
        seen.append((threading.get_ident(), torch.get_num_threads()))
        return real(self, *args)

    monkeypatch.setattr(sampling._Rows, "step", watched)
    monkeypatch.setattr(sampling, "SPLIT_ROWS", 11)
    halves = sample(model, tokenizer, MIXED, 50, temperature=T, greedy=greedy, seed=11)
    assert torch.get_num_threads() == 2
    assert len({thread for thread, _ in seen}) == 2 and {n for _, n in seen} == {1}
    same = same_rows(halves.completion_ids, whole.completion_ids, tokenizer.pad_token_id)  # (B,)
    assert same.sum() >= len(MIXED) - 1, same
    assert [t for t, s in zip(halves.text, same) if s] == [t for t, s in zip(whole.text, same) if s]
    assert torch.equal(halves.truncated[same], whole.truncated[same])
    if halves.logp.shape == whole.logp.shape:
        torch.testing.assert_close(halves.logp[same], whole.logp[same], atol=2e-5, rtol=0)


def test_a_batch_of_few_prompts_stays_whole(monkeypatch, two_threads):
    """Halves are cut by distinct prompts, the rows the first step computes: 48 rows of 6 prompts stay one batch
    where 22 rows of 22 prompts split (above), at the same SPLIT_ROWS."""
    model, tokenizer = load(PRETRAINED, device="cpu")
    seen = []
    real = sampling._Rows.step
    monkeypatch.setattr(sampling._Rows, "step", lambda self, *args: seen.append(threading.get_ident()) or
                        real(self, *args))  # fmt: skip
    monkeypatch.setattr(sampling, "SPLIT_ROWS", 11)
    sample(model, tokenizer, GROUPS, 50, temperature=1.0, seed=3)
    assert set(seen) == {threading.get_ident()}


def test_a_failure_in_either_half_reaches_the_caller_and_the_threads_come_back(monkeypatch, two_threads):
    model, tokenizer = load(PRETRAINED, device="cpu")
    monkeypatch.setattr(sampling, "SPLIT_ROWS", 2)
    real = sampling._Rows.step

    def second_half_fails(self, *args):
        if self.rows.start > 0:
            raise RuntimeError("second half")
        return real(self, *args)

    monkeypatch.setattr(sampling._Rows, "step", second_half_fails)
    with pytest.raises(RuntimeError, match="second half"):
        sample(model, tokenizer, MIXED[:4], 10, seed=0)
    assert torch.get_num_threads() == 2


def test_the_second_half_runs_without_a_graph_on_the_models_own_forward(monkeypatch, two_threads):
    """Autograd's switch is per thread: the second half's thread must not build a graph either."""
    model, tokenizer = load(PRETRAINED, device="cpu")
    monkeypatch.setattr(decoding, "supports", lambda model: False)  # transformers' forward, not the lean decoder
    monkeypatch.setattr(sampling, "SPLIT_ROWS", 2)
    graphs = []  # per call of the model's forward: did it record a graph?
    real = sampling._CachedForward.__call__

    def watched(self, *args):
        logits = real(self, *args)
        graphs.append((threading.get_ident(), logits.requires_grad))
        return logits

    monkeypatch.setattr(sampling._CachedForward, "__call__", watched)
    sample(model, tokenizer, MIXED[:6], 8, seed=0)
    assert len({thread for thread, _ in graphs}) == 2 and not any(grad for _, grad in graphs)
