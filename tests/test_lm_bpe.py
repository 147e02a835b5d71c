"""The LM half with a tokenizer unlike the course's: byte-level BPE with its own special tokens and a chat template.

The tokenizer is trained here, offline, in milliseconds, on the tasks' own text; the model is a random tiny Llama.
Tasks, rewards, the sampler's checks, evaluation and the GRPO trainer must treat it as they treat the character one.
"""

import random

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from minirl.lm import build_tokenizer, evaluate, grpo, load, logprobs, make_model, sample, save
from minirl.lm import rewards as rw
from minirl.lm.tasks import TASKS, format_ok, get_task, make_problems, token_budget
from minirl.lm.tokenizer import render_prompt

BOS, EOS, PAD, UNK, START = "<|bos|>", "<|im_end|>", "<|pad|>", "<unk>", "<|im_start|>"
CHAT = (  # ChatML, as SmolLM2 and Qwen write it, opened by the bos token
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SIZES = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def build_bpe(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on the tasks' text. Its alphabet is only the bytes seen, so a character it never saw
    is ``<unk>``; encoding prepends ``<|bos|>``, as Llama's tokenizers do."""
    rng = random.Random(0)
    problems = [get_task(name).draw(rng) for name in TASKS for _ in range(200)]
    text = [f"user\n{p.prompt}\nassistant\n{p.completion}" for p in problems]  # as the chat template lays it out
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = [PAD, BOS, EOS, UNK, START]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False)
    tok.train_from_iterator(text, trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
                                   padding_side="left", chat_template=CHAT)  # fmt: skip


@pytest.fixture(scope="module")
def bpe():
    return build_bpe()


@pytest.fixture(scope="module")
def checkpoint(bpe, tmp_path_factory):
    """A random tiny Llama on the BPE vocabulary, saved as a checkpoint folder the trainers load."""
    path = tmp_path_factory.mktemp("bpe") / "model"
    save(make_model(bpe, seed=0, **SIZES), bpe, path)
    return str(path)


def test_the_bpe_tokenizer_is_unlike_the_characters(bpe):
    text = "347+585=<think>7+5=12 c1</think>"
    ids = bpe(text)["input_ids"]
    assert ids[0] == bpe.bos_token_id and len(ids) < len(text) - 10  # merges: far fewer tokens than characters
    assert "<think>" not in bpe.convert_ids_to_tokens(ids)  # the tags are plain text here, split like any other


@pytest.mark.parametrize("name", list(TASKS))
def test_targets_round_trip_and_earn_their_rewards(bpe, name):
    """Decoded BPE tokens are the target text, so the rewards score it as they score the characters, and the budget
    counts this tokenizer's tokens: every target and its eos fit."""
    task = get_task(name)
    assert token_budget(task, build_tokenizer()) == task.max_new_tokens  # the same room under the course's tokenizer
    problems = make_problems(task, "train", 30)
    targets = [p.completion for p in problems]
    decoded = bpe.batch_decode(bpe(targets, add_special_tokens=False)["input_ids"], skip_special_tokens=True)
    assert decoded == targets
    answers = [p.answer for p in problems]
    right = 0.0 if name == "addition-plain" else 1.0  # the plain task has no <answer> tag to read, by design
    assert rw.accuracy_reward(task)([p.prompt for p in problems], decoded, answers) == [right] * 30
    assert all(format_ok(t) != (name in ("addition-plain", "addition-chat")) for t in decoded)
    assert max(len(bpe(t, add_special_tokens=False)["input_ids"]) + 1 for t in targets) <= token_budget(task, bpe)


def test_a_chat_prompt_has_one_bos_and_the_assistant_turn_open(bpe):
    text = render_prompt(bpe, "What is 2+3? Answer with the number only.", chat=True)
    ids = bpe(text)["input_ids"]
    assert ids.count(bpe.bos_token_id) == 1 and ids[0] == bpe.bos_token_id  # the template's bos, not a second
    assert text.endswith(f"{START}assistant\n") and render_prompt(bpe, "2+3=") == "2+3="
    with pytest.raises(ValueError, match="chat template .* Use chat=False"):
        render_prompt(build_tokenizer(), "2+3=", chat=True)


def test_sampling_with_bpe_stops_at_its_eos_and_scores_its_tokens(bpe):
    model = make_model(bpe, seed=0, **SIZES)
    prompts = [render_prompt(bpe, p.prompt, chat=True) for p in make_problems(get_task("addition-chat"), "train", 6)]
    boost = torch.zeros(len(bpe))
    boost[bpe.eos_token_id] = 2.5  # an eos likely enough that some rows stop early and others run out
    model.lm_head.register_forward_hook(lambda module, args, logits: logits + boost)
    s = sample(model, bpe, prompts, max_new_tokens=12, seed=0)
    assert s.truncated.any() and not s.truncated.all()
    recomputed = logprobs(model, s.ids, s.mask)[:, -s.completion_ids.shape[1] :]  # (B, C)
    torch.testing.assert_close(recomputed, s.logp, atol=2e-5, rtol=0)
    for ids, mask, truncated, text in zip(s.completion_ids, s.completion_mask, s.truncated, s.text):
        n = int(mask.sum())
        assert truncated == (n == 12 and ids[n - 1] != bpe.eos_token_id)
        assert text == bpe.decode(ids[:n], skip_special_tokens=True) and EOS not in text


def test_characters_the_bpe_never_saw_are_named(bpe):
    model = make_model(bpe, seed=0, **SIZES)
    with pytest.raises(ValueError, match=r"prompt 1 .* holds \['é'.*that the tokenizer's vocabulary lacks"):
        sample(model, bpe, ["1+1=", "12+3é="], max_new_tokens=3)
    assert len(sample(model, bpe, [render_prompt(bpe, "1+1=", chat=True)], max_new_tokens=3).text) == 1


def test_evaluate_and_grpo_run_on_a_bpe_checkpoint_with_its_chat_template(bpe, checkpoint):
    model, tok = load(checkpoint, device="cpu")
    assert tok.chat_template == CHAT and tok.eos_token == EOS
    ev = evaluate(model, tok, get_task("addition-chat"), n=6, k=2, chat=True)
    assert ev.examples[0][0].startswith("What is ") and 0 <= ev.accuracy <= 1 and ev.sampled_accuracy is not None

    seen = []
    cfg = grpo.GRPOConfig(model=checkpoint, task="addition-chat", chat=True, steps=2, prompts_per_step=2,
                          group_size=4, max_new_tokens=6, eval_every=2, eval_n=4, device="cpu")  # fmt: skip
    length = lambda prompts, completions, answers: [float(len(c)) for c in completions]  # spread for a random model
    result = grpo.train(cfg, reward_fn=length, on_batch=lambda step, prompts, *_: seen.extend(prompts))
    assert all(p.startswith("What is ") for p in seen)  # rewards see the question, the model reads the template
    assert [e["step"] for e in result.evals] == [0, 2] and len(result.history.rows) == 2
    before = dict(model.named_parameters())
    assert any(not torch.equal(p, before[n]) for n, p in result.model.named_parameters())
