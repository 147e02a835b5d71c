"""The sampler against a brute-force forward pass without cache, padding or position tricks."""

import random
import re

import pytest
import torch

from minirl.lm import build_tokenizer, logprobs, make_model, sample, sft
from minirl.lm.sampling import completion_logprobs

SIZES = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
PROMPTS = ["1+1=", "347+585=", "sort 42 7 88 15=", "9", "12+34="]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    """A tiny model taught, in 30 steps, to write 0-40 characters and stop: some rows end early, some run out."""
    rng = random.Random(0)
    text = lambda chars, low, high: "".join(rng.choices(chars, k=rng.randint(low, high)))
    examples = [(text("0123456789+=", 1, 8), text("abc<> ", 0, 40)) for _ in range(64)]
    model = make_model(tok, seed=0, **SIZES)
    return sft.train(model, tok, examples, sft.SFTConfig(steps=30, batch_size=16, lr=1e-2, warmup_steps=1)).model


def brute_force_logp(model, row: torch.Tensor, temperature: float) -> torch.Tensor:
    """log pi(row_t | row_<t) for t >= 1 of one unpadded row: a plain forward, default positions, no mask."""
    with torch.no_grad():
        logits = model(input_ids=row[None]).logits[0].double() / temperature  # (L, V)
    return torch.log_softmax(logits[:-1], -1).gather(-1, row[1:, None]).squeeze(-1)  # (L - 1,)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.0])
def test_sampler_logp_matches_brute_force_and_logprobs(model, tok, temperature):
    s = sample(model, tok, PROMPTS, max_new_tokens=30, temperature=temperature, seed=1)
    assert s.truncated.any() and not s.truncated.all(), "the seed should give rows that stop and rows that do not"
    recomputed = logprobs(model, s.ids, s.mask, temperature=temperature).detach()  # (B, L)
    c = s.completion_ids.shape[1]
    torch.testing.assert_close(recomputed[:, -c:], s.logp, atol=2e-5, rtol=0)
    for i in range(len(PROMPTS)):
        row = s.ids[i][s.mask[i]]  # prompt + completion, padding dropped
        brute = brute_force_logp(model, row, temperature)
        n_completion = int(s.completion_mask[i].sum())
        torch.testing.assert_close(s.logp[i][s.completion_mask[i]].double(), brute[-n_completion:], atol=2e-5, rtol=0)
        torch.testing.assert_close(recomputed[i][s.mask[i]][1:].double(), brute, atol=2e-5, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_completion_logprobs_compute_each_prompt_once_and_equal_logprobs(model, tok, temperature):
    """Rows that repeat a prompt (and prompts of different lengths, so left padding): values and gradients equal to
    one forward pass over every whole row, with 3 rows through the prompt pass instead of 7."""
    prompts = ["1+1=", "347+585=", "1+1=", "9", "347+585=", "1+1=", "9"]
    s = sample(model, tok, prompts, max_new_tokens=30, temperature=temperature, seed=2)
    assert s.truncated.any() and not s.truncated.all()
    weights = torch.randn(s.completion_ids.shape, generator=torch.Generator().manual_seed(0))  # (B, C)
    params = list(model.parameters())
    P = s.prompt_ids.shape[1]
    want = logprobs(model, s.ids, s.mask, temperature)[:, P:]  # (B, C)
    want_grads = torch.autograd.grad((want * weights).sum(), params)
    shapes = []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
                                           with_kwargs=True)  # fmt: skip
    try:
        got = completion_logprobs(model, s.prompt_ids, s.prompt_mask, s.completion_ids, s.completion_mask, temperature)
    finally:
        hook.remove()
    C = s.completion_ids.shape[1]
    assert shapes == [(3, P), (7, C - 1)]  # the distinct prompts, then every row's completion but its last column
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    assert (got[~s.completion_mask] == 0).all()
    for g, w in zip(torch.autograd.grad((got * weights).sum(), params), want_grads):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_completion_logprobs_compute_each_distinct_row_once(model, tok):
    """Rows that repeat another row (prompt and completion) go through the model once: 3 distinct rows of 6 (two of
    them with the same prompt), with the values and gradients of one forward pass over all 6 whole rows."""
    s = sample(model, tok, ["1+1=", "347+585=", "1+1="], max_new_tokens=30, seed=2)
    assert not torch.equal(s.completion_ids[0], s.completion_ids[2])  # two completions of one prompt
    order = torch.tensor([0, 1, 0, 2, 1, 0])  # (6,) rows 0 and 1 repeated
    ids, mask = s.ids[order], s.mask[order]  # (6, L)
    parts = s.prompt_ids[order], s.prompt_mask[order], s.completion_ids[order], s.completion_mask[order]
    weights = torch.randn(parts[2].shape, generator=torch.Generator().manual_seed(0))  # (6, C)
    params = list(model.parameters())
    P, C = s.prompt_ids.shape[1], s.completion_ids.shape[1]
    want = logprobs(model, ids, mask)[:, P:]  # (6, C)
    want_grads = torch.autograd.grad((want * weights).sum(), params)
    shapes = []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
                                           with_kwargs=True)  # fmt: skip
    try:
        got = completion_logprobs(model, *parts)
    finally:
        hook.remove()
    assert shapes == [(2, P), (3, C - 1)]  # the 2 distinct prompts, then the 3 distinct rows
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    assert torch.equal(got[0], got[2]) and torch.equal(got[0], got[5])  # copies get their twin's numbers
    for g, w in zip(torch.autograd.grad((got * weights).sum(), params), want_grads):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_completion_logprobs_of_one_token_completions_need_only_the_prompt_pass(model, tok):
    """A completion of one column is scored from the prompts' last logits alone: the same numbers as whole rows."""
    s = sample(model, tok, ["1+1=", "347+585=", "1+1="], max_new_tokens=1, seed=4)
    P = s.prompt_ids.shape[1]
    want = logprobs(model, s.ids, s.mask)[:, P:]  # (B, 1)
    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        got = completion_logprobs(model, s.prompt_ids, s.prompt_mask, s.completion_ids, s.completion_mask)
    finally:
        hook.remove()
    assert len(calls) == 1 and got.shape == (3, 1)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)


def test_masks_include_eos_and_mark_truncation(model, tok):
    s = sample(model, tok, PROMPTS, max_new_tokens=30, seed=1)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    for ids, mask, truncated in zip(s.completion_ids, s.completion_mask, s.truncated):
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any()  # one block from the start
        assert (ids[n:] == pad).all()
        if truncated:
            assert n == 30 and eos not in ids.tolist()
        else:
            assert ids[n - 1] == eos and eos not in ids[: n - 1].tolist()  # the eos is the last masked token
    assert (s.logp[~s.completion_mask] == 0).all() and (s.logp[s.completion_mask] < 0).all()
    assert s.prompt_mask.sum(1).tolist() == [len(p) + 1 for p in PROMPTS]  # bos + one token per character


def test_a_row_does_not_depend_on_its_neighbours(model, tok):
    """The same prompt and completion scored alone and beside a much longer prompt (more left padding)."""
    alone = sample(model, tok, ["1+1="], max_new_tokens=20, seed=3)
    crowd = sample(model, tok, ["1+1=", "a much longer prompt, forcing padding " * 3], max_new_tokens=20, seed=3)
    ids = torch.nn.utils.rnn.pad_sequence(
        [crowd.ids[1][crowd.mask[1]], alone.ids[0][alone.mask[0]]], batch_first=True, padding_side="left"
    )
    mask = torch.nn.utils.rnn.pad_sequence(
        [crowd.mask[1][crowd.mask[1]], alone.mask[0][alone.mask[0]]], batch_first=True, padding_side="left"
    )
    together = logprobs(model, ids, mask).detach()[1][mask[1]]
    by_itself = logprobs(model, alone.ids, alone.mask).detach()[0][alone.mask[0]]
    torch.testing.assert_close(together, by_itself, atol=1e-5, rtol=0)


def test_greedy_takes_the_argmax_and_the_identity_holds(model, tok):
    s = sample(model, tok, PROMPTS[:2], max_new_tokens=10, greedy=True)
    for i in range(2):
        row = s.ids[i][s.mask[i]].clone()
        n = int(s.completion_mask[i].sum())
        with torch.no_grad():
            logits = model(input_ids=row[None]).logits[0]  # (L, V)
        # the token drawn is a largest logit of the uncached forward; a tolerance, not argmax equality, since cached
        # and uncached passes round differently and a near-tie may resolve either way on another CPU
        steps = logits[-n - 1 : -1]  # (n, V)
        assert (steps.max(-1).values - steps.gather(-1, row[-n:, None]).squeeze(-1) <= 1e-4).all()
        # log pi(o | q) = sum_t log pi(o_t | q, o_<t). The sampler computes in float32, the brute force in float64: on
        # this AMD CPU the two sums of 10 terms (about -17.4) differed by 2.4e-6, so float64's default 1e-7 cannot hold
        torch.testing.assert_close(
            s.logp[i].sum().double(), brute_force_logp(model, row, 1.0)[-n:].sum(), atol=2e-5, rtol=0
        )


def test_seed_and_generator_make_sampling_repeatable(model, tok):
    a = sample(model, tok, PROMPTS, max_new_tokens=12, seed=7)
    b = sample(model, tok, PROMPTS, max_new_tokens=12, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a.completion_ids, b.completion_ids) and a.text == b.text
    model.train()
    sample(model, tok, PROMPTS, max_new_tokens=2, seed=7)
    assert model.training, "sampling must give the model back in the mode it came in"
    model.eval()


def test_small_decode_steps_run_on_one_thread_and_the_count_comes_back(model, tok, monkeypatch):
    import minirl.lm.sampling as sampling

    seen = []  # the thread count at each decode step
    real = sampling.decoding.LlamaDecoder.__call__
    monkeypatch.setattr(sampling.decoding.LlamaDecoder, "__call__",
                        lambda self, *a: seen.append(torch.get_num_threads()) or real(self, *a))  # fmt: skip
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        small = sample(model, tok, PROMPTS, max_new_tokens=6, seed=3)
        assert seen and set(seen) == {1} and torch.get_num_threads() == 2
        seen.clear()
        monkeypatch.setattr(sampling, "ONE_THREAD_FLOPS", 0)  # every step counts as large: the caller's threads
        large = sample(model, tok, PROMPTS, max_new_tokens=6, seed=3)
        assert seen and set(seen) == {2} and torch.get_num_threads() == 2
        assert small.text == large.text  # the same draws either way
        with pytest.raises(ValueError, match="temperature"):
            sample(model, tok, PROMPTS, max_new_tokens=6, temperature=-1.0)
        monkeypatch.setattr(sampling, "ONE_THREAD_FLOPS", 1e30)
        monkeypatch.setattr(sampling.decoding.LlamaDecoder, "__call__", lambda self, *a: 1 / 0)
        with pytest.raises(ZeroDivisionError):  # a failure inside the loop also gives the threads back
            sample(model, tok, PROMPTS, max_new_tokens=6, seed=3)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_top_k_draws_only_among_the_k_most_likely(model, tok):
    s = sample(model, tok, PROMPTS, max_new_tokens=8, top_k=3, seed=0)
    for i in range(len(PROMPTS)):
        row = s.ids[i][s.mask[i]]
        n = int(s.completion_mask[i].sum())
        with torch.no_grad():
            logits = model(input_ids=row[None]).logits[0, -n - 1 : -1]  # (n, V)
        top3 = logits.topk(3, -1).indices  # (n, 3)
        assert (top3 == row[-n:, None]).any(-1).all()


def test_text_is_the_decoded_completion(model, tok):
    s = sample(model, tok, PROMPTS, max_new_tokens=30, seed=1)
    for ids, mask, text in zip(s.completion_ids, s.completion_mask, s.text):
        assert text == tok.decode(ids[mask], skip_special_tokens=True)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(prompts=[]), ValueError, "non-empty list"),
        (dict(prompts="1+1="), ValueError, "non-empty list"),
        (dict(prompts=["1+1=", 3]), TypeError, "strings"),
        (dict(temperature=0), ValueError, "greedy=True"),
        (dict(temperature=-1.0), ValueError, "temperature"),
        (dict(temperature=float("nan")), ValueError, "temperature"),
        (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
        (dict(top_k=0), ValueError, "top_k"),
        (dict(seed=1, generator=torch.Generator()), ValueError, "not both"),
    ],
)
def test_bad_input_is_named(model, tok, kwargs, error, match):
    args = dict(prompts=["1+1="], max_new_tokens=5) | kwargs
    with pytest.raises(error, match=match):
        sample(model, tok, **args)


def test_logprobs_checks_its_input(model):
    ids = torch.ones(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="temperature"):
        logprobs(model, ids, ids.bool(), temperature=0.0)
    with pytest.raises(ValueError, match=r"\(B, L\)"):
        logprobs(model, ids, ids[:, :4].bool())


def test_a_tokenizer_without_pad_is_named(model):
    tok = build_tokenizer()
    tok.pad_token = None
    with pytest.raises(ValueError, match="pad token"):
        sample(model, tok, ["1+1="], max_new_tokens=3)


def test_a_prompt_beyond_the_context_is_refused(model, tok):
    context = model.config.max_position_embeddings  # 256
    fits = "1" * (context - 10 - 1)  # the bos takes one position
    assert sample(model, tok, [fits], max_new_tokens=10, greedy=True).completion_ids.shape[0] == 1
    with pytest.raises(ValueError, match=f"together {context + 1}, more than the model's {context} positions"):
        sample(model, tok, ["1+1=", fits + "1"], max_new_tokens=10)
    with pytest.raises(ValueError, match="Shorten the prompt to at most 246 tokens"):
        sample(model, tok, ["1" * 1000], max_new_tokens=10)


@pytest.mark.parametrize("prompt, pieces", [("12+3é=", "['é']"), ("sort 4 → 2", "['→']"), ("<unk>ü", "['ü']")])
def test_characters_outside_the_vocabulary_are_refused(model, tok, prompt, pieces):
    with pytest.raises(
        ValueError, match=f"prompt 1 .* holds {re.escape(pieces)} that the tokenizer's vocabulary lacks"
    ):
        sample(model, tok, ["1+1=", prompt], max_new_tokens=3)


def test_the_unknown_token_written_out_is_accepted(model, tok):
    """``<unk>`` typed on purpose is the tokenizer's own special token, not a lost character."""
    assert len(sample(model, tok, ["12+3=<unk>"], max_new_tokens=3).text) == 1
