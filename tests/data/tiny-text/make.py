#!/usr/bin/env python3
"""Writes tokenizer.json and tokenizer_config.json of the test tokenizer that pairs with
pagoda-mkmodel's tiny preset (vocabulary 512, BOS 1, EOS 2): a byte-level BPE laid out as
Llama 3's (Split with Llama 3's pattern, ByteLevel, TemplateProcessing with BOS), six special
tokens at 0-5 (added tokens, and in the model's vocabulary), the 256 byte symbols at 6-261 and
250 merges learned here from the text of docs/*.md (as it was when the file was made; the output
is committed), deterministically. Run from the repository root: python3 tests/data/tiny-text/make.py.
The output is committed; this script says how it was made."""
import collections, glob, json, os, re

SPECIALS = ["<|pad|>", "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eot_id|>"]
NUM_MERGES = 512 - len(SPECIALS) - 256
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_symbols():
    # GPT-2's map of the 256 bytes to printable characters.
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def main():
    sym = byte_symbols()
    text = "".join(open(p, encoding="utf-8").read() for p in sorted(glob.glob("docs/*.md")))
    # Training words: an ASCII approximation of the split (letters with one leading space).
    words = collections.Counter(re.findall(r" ?[A-Za-z]+| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]+", text))
    corpus = {tuple(sym[b] for b in w.encode()): c for w, c in words.items()}
    merges = []
    for _ in range(NUM_MERGES):
        pairs = collections.Counter()
        for w, c in corpus.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        joined = best[0] + best[1]
        new = {}
        for w, c in corpus.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] = new.get(tuple(out), 0) + c
        corpus = new
    # The special tokens are in the model's vocabulary too, at their ids (as Llama 2's <s> and </s>
    # are): an added token absent from it would get an id after the vocabulary's in HF.
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for b in range(256):
        vocab[sym[b]] = len(SPECIALS) + b
    for a, b in merges:
        vocab[a + b] = len(vocab)
    assert len(vocab) == 512 and sorted(vocab.values()) == list(range(512)), len(vocab)
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, s in enumerate(SPECIALS)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [1],
                                                                    "tokens": ["<|begin_of_text|>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": True, "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    template = (
        "{{- bos_token }}\n"
        "{%- for message in messages %}\n"
        "    {%- if message['role'] not in ['system', 'user', 'assistant'] %}\n"
        "        {{- raise_exception('unknown role: ' + message['role']) }}\n"
        "    {%- endif %}\n"
        "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
        "{%- endif %}\n")
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
              "model_max_length": 2048, "tokenizer_class": "PreTrainedTokenizerFast",
              "chat_template": template}
    with open(os.path.join(here, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
