"""The tiny default's tokenizer, built locally: BPE over the synthetic training split.

HTML table tags are single tokens; LaTeX commands and lexicon words become single tokens through BPE
merges (words never merge across spaces, digits stay single). Special tokens: `<|endoftext|>` (EOS),
`<|pad|>`, `<|mask|>` (the block-diffusion mask); no BOS, so a prompt tokenizes the same in HF, vLLM
and TRL. `decode(encode(s)) == s` for every string over the training alphabet.

Example:
    >>> tok = build_tokenizer()
    >>> tok.decode(tok("<table><tr><td>42</td></tr></table>").input_ids)
    '<table><tr><td>42</td></tr></table>'
"""
from __future__ import annotations

import string

EOS, PAD, MASK, UNK = "<|endoftext|>", "<|pad|>", "<|mask|>", "<|unk|>"
VOCAB_SIZE = 2048
_SPANS = range(2, 5)
HTML_TOKENS = (
    ["<table>", "</table>", "<thead>", "</thead>", "<tbody>", "</tbody>", "<tr>", "</tr>", "<td>", "</td>",
     "<th>", "</th>", "<td", ">"]
    + [f' rowspan="{n}"' for n in _SPANS] + [f' colspan="{n}"' for n in _SPANS]
)
_CORPUS_ROWS = 20000


def build_tokenizer(corpus: list[str] | None = None):
    """Train the BPE tokenizer on `corpus` (default: prompts and targets of `tiny-train`)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if corpus is None:
        from grpo.synthetic.splits import generate
        corpus = [text for row in generate("tiny-train", _CORPUS_ROWS) for text in (row["prompt"], row["target"])]
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True),
        pre_tokenizers.Digits(individual_digits=True),
        # line breaks, cell separators and LaTeX group/script marks stay single tokens, so a
        # serialized crop and its transcription split into the same tokens
        pre_tokenizers.Split(Regex(r"[\n|{}^_]"), behavior="isolated"),
    ])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    specials = [EOS, PAD, MASK, UNK]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=specials, show_progress=False,
        initial_alphabet=list(string.printable.replace(" ", "▁")),
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens(HTML_TOKENS)  # after training, so their ids follow the BPE vocabulary
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        additional_special_tokens=[MASK], model_max_length=4096, padding_side="right",
    )
