"""A character-level tokenizer that saves and loads like any Hugging Face tokenizer (``notebooks/08_tiny_lm.ipynb``).

Every printable ASCII character and the newline is one token; so are the R1 template's tags ``<think>``,
``</think>``, ``<answer>``, ``</answer>``, which never split into characters. ``<bos>`` is prepended to every encoded
text, ``<eos>`` ends a completion, ``<pad>`` fills batches on the left (the side generation needs), and ``<unk>``
stands for any other character.

The object is built with the ``tokenizers`` library and wrapped as a transformers fast tokenizer, so
``save_pretrained`` and ``AutoTokenizer.from_pretrained`` round-trip it, and the sampling and training code treats it
exactly as it would treat the tokenizer of a real model.

``render_prompt`` turns a task's prompt into the text a model reads: the prompt itself, or for an instruct model one
user turn of its tokenizer's chat template, opening the assistant's answer.
"""

import string

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL = (PAD, BOS, EOS, UNK)
TAGS = ("<think>", "</think>", "<answer>", "</answer>")
CHARS = tuple(string.printable[:95]) + ("\n",)  # digits, letters, punctuation, space, newline


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The course's character-level tokenizer: ``len(tok) == 104``; ids 0-3 are pad, bos, eos, unk; 4-7 the tags."""
    vocab = {token: i for i, token in enumerate(SPECIAL + TAGS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one piece per character
    tok.decoder = decoders.Fuse()  # join characters back without spaces
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    # The tags are whole tokens but not "special": decoding with skip_special_tokens=True keeps them in the text.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK, padding_side="left"
    )


def render_prompt(tokenizer, prompt: str, chat: bool = False) -> str:
    """The text the model reads for ``prompt``: ``prompt`` itself, or with ``chat`` the tokenizer's chat template
    applied to one user message ``prompt``, ending where the assistant's reply begins (``add_generation_prompt``)."""
    if not chat:
        return prompt
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "chat=True needs a tokenizer with a chat template (tokenizer.chat_template is empty); the course's "
            "character tokenizer has none. Use chat=False, or load an instruct model's tokenizer"
        )
    turn = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    # A template that writes the bos token itself, read by a tokenizer that also adds one on encoding, would give two.
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and tokenizer("")["input_ids"][:1] == [tokenizer.bos_token_id]:
        text = text[len(bos) :]
    return text
