#!/usr/bin/env python3
"""Writes the seed corpora of the JSON and safetensors fuzz targets into tests/fuzz/corpus/:
small valid files and near-valid ones (one thing wrong each), so that libFuzzer starts from
every branch of the decoders rather than from nothing. The protobuf targets' seeds come from
fuzz_seeds.c (pagoda-fuzz-seeds). Deterministic: running it again writes the same bytes.

    tests/fuzz/make_corpus.py [OUT_DIR]   (default: tests/fuzz/corpus)
"""
import json
import os
import struct
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- tenants files (router/tenants.h) ----
full = {
    "admin_keys": ["adm"],
    "groups": [{"name": "team", "cache_quota_blocks": 1000}],
    "tenants": [
        {"name": "alice", "api_keys": ["k1", "k2"], "group": "team", "max_running": 64,
         "max_waiting": 256},
        {"name": "bob", "api_keys": ["k3"], "cache_quota_blocks": 500},
    ],
    "pins": [{"name": "sys", "token_ids": [1, 2, 3], "tenants": ["alice", "bob"]}],
}
put("tenants", "full.json", json.dumps(full))
put("tenants", "minimal.json", '{"tenants": [{"name": "a", "api_keys": ["k"]}]}')
near = [
    ("dup_key.json", '{"tenants": [{"name": "a", "api_keys": ["k"]}, {"name": "b", "api_keys": ["k"]}]}'),
    ("admin_is_tenant_key.json", '{"admin_keys": ["k"], "tenants": [{"name": "a", "api_keys": ["k"]}]}'),
    ("unknown_group.json", '{"tenants": [{"name": "a", "api_keys": ["k"], "group": "g"}]}'),
    ("quota_in_group.json", '{"groups": [{"name": "g"}], "tenants": [{"name": "a", "api_keys": ["k"], "group": "g", "cache_quota_blocks": 1}]}'),
    ("pin_unknown_tenant.json", '{"tenants": [{"name": "a", "api_keys": ["k"]}], "pins": [{"name": "p", "token_ids": [1], "tenants": ["zz"]}]}'),
    ("pin_negative.json", '{"tenants": [{"name": "a", "api_keys": ["k"]}], "pins": [{"name": "p", "token_ids": [-1], "tenants": ["a"]}]}'),
    ("bad_name.json", '{"tenants": [{"name": "a b", "api_keys": ["k"]}]}'),
    ("unknown_key.json", '{"tenants": [{"name": "a", "api_keys": ["k"], "max_runing": 3}]}'),
    ("limits.json", '{"tenants": [{"name": "a", "api_keys": ["k"], "max_running": 0, "max_waiting": 16777217}]}'),
    ("no_tenants.json", '{"admin_keys": []}'),
    ("dup_object_key.json", '{"tenants": [], "tenants": []}'),
    ("truncated.json", json.dumps(full)[:70]),
]
for name, text in near:
    put("tenants", name, text)

# ---- config.json (model/model_config.h) ----
llama31 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-05,
    "max_position_embeddings": 131072, "tie_word_embeddings": False, "attention_bias": False,
    "mlp_bias": False, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "torch_dtype": "bfloat16", "hidden_act": "silu",
}
mistral = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 32768,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2,
}
qwen2 = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936,
    "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "max_position_embeddings": 32768, "max_window_layers": 21, "rope_theta": 1000000.0,
    "rope_scaling": None, "sliding_window": 32768, "use_sliding_window": False,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "bos_token_id": 151643,
    "eos_token_id": 151643,
}
llama_v5 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
    "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
    "num_attention_heads": 32, "num_key_value_heads": 4, "rms_norm_eps": 1e-05,
    "max_position_embeddings": 8192, "attention_bias": True,
    "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
}
for name, cfg in [("llama31", llama31), ("mistral", mistral), ("qwen2", qwen2),
                  ("llama_v5", llama_v5)]:
    put("model_config", name + ".json", json.dumps(cfg))


def variant(base, **changes):
    c = dict(base)
    for k, v in changes.items():
        if v is ...:
            c.pop(k, None)
        else:
            c[k] = v
    return json.dumps(c)


near = [
    ("gemma.json", variant(llama31, architectures=["GemmaForCausalLM"], model_type="gemma")),
    ("type_mismatch.json", variant(llama31, model_type="qwen2")),
    ("kv_heads.json", variant(llama31, num_key_value_heads=7)),
    ("no_vocab.json", variant(llama31, vocab_size=...)),
    ("yarn.json", variant(llama31, rope_scaling={"rope_type": "yarn", "factor": 4.0})),
    ("sliding.json", variant(qwen2, use_sliding_window=True)),
    ("int8.json", variant(mistral, torch_dtype="int8")),
    ("dtype_mismatch.json", variant(llama_v5, torch_dtype="bfloat16")),
    ("rope_mismatch.json", variant(llama_v5, rope_theta=500000.0)),
    ("eos_many.json", variant(llama31, eos_token_id=list(range(12)))),
    ("negative.json", variant(mistral, hidden_size=-4096)),
    ("huge.json", variant(mistral, vocab_size=2**62, max_position_embeddings=1e300)),
    ("string_size.json", variant(mistral, hidden_size="4096")),
]
for name, text in near:
    put("model_config", name, text)

# ---- safetensors files (model/safetensors.h) ----


def st_file(header, data, pad_to=8):
    h = json.dumps(header, separators=(",", ":")).encode()
    while (8 + len(h)) % pad_to:
        h += b" "
    return struct.pack("<Q", len(h)) + h + data


two = {
    "__metadata__": {"format": "pt"},
    "a.weight": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
    "b.weight": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]},
}
put("safetensors", "two.safetensors", st_file(two, bytes(range(20))))
put("safetensors", "scalar_f16.safetensors",
    st_file({"s": {"dtype": "F16", "shape": [], "data_offsets": [0, 2]}}, b"\x00\x3c"))
put("safetensors", "empty.safetensors", st_file({}, b""))
put("safetensors", "zero_dim.safetensors",
    st_file({"z": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]}}, b""))
near = [
    ("overlap", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                 "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)),
    ("outside", {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8)),
    ("count", {"a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)),
    ("dtype", {"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}, bytes(8)),
    ("misaligned", {"a": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, bytes(8)),
    ("dims", {"a": {"dtype": "F32", "shape": [1] * 9, "data_offsets": [0, 4]}}, bytes(4)),
    ("reversed", {"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}}, bytes(8)),
    ("big_shape", {"a": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 0]}}, b""),
]
for name, header, data in near:
    put("safetensors", name + ".safetensors", st_file(header, data))
put("safetensors", "short_length.safetensors", b"\x10\x00\x00")
put("safetensors", "truncated_header.safetensors", struct.pack("<Q", 100) + b'{"a":')
put("safetensors", "huge_length.safetensors", struct.pack("<Q", 2**63) + b"{}")

# ---- scheduler scripts (fuzz_scheduler.c: three configuration bytes, then commands) ----
OP_RAW_ROUTER, OP_RAW_WORKER, OP_TICK, OP_SUBMIT, OP_CANCEL, OP_ANSWER, OP_HELLO = 0, 1, 2, 3, 5, 6, 8
# An op byte is read modulo 10, its other bits by mask: 19 is 9 with bit 16 (a policy), 18 is 8
# with bit 16 (the worker restarted), 148 is 8 with bits 16 and 128 (and kvpool: a new pool).
OP_MISC, OP_POLICY = 9, 19
OP_RESTART, OP_NEW_POOL = 18, 148


def tok(t):
    """A token id below 240, as fuzz_scheduler.c's token() reads it."""
    return bytes([t % 240, 0])


def submit(idn, prompt, max_tokens, sampling=None, stop=None, output=None, tenant=0):
    flags = (1 if sampling else 0) | (tenant << 3) | (32 if stop else 0) | (128 if output else 0)
    b = bytes([OP_SUBMIT, flags, idn, len(prompt) - 1]) + b"".join(tok(t) for t in prompt)
    if sampling:
        b += bytes(sampling)
    b += bytes([max_tokens + 1])
    if stop:
        b += bytes([len(stop) - 1]) + b"".join(tok(t) for t in stop)
    if output:
        b += bytes([len(output) - 1]) + b"".join(tok(t) for t in output)
    return b


def answer(how=0, tokens=()):
    """The worker answers the oldest message: how (15: lost, 14: the step fails, 13: its first
    row fails, 12: a resync's first sequence is left out), then 8 tokens."""
    tokens = list(tokens) + [0] * (8 - len(tokens))
    return bytes([OP_ANSWER, how]) + b"".join(tok(t) for t in tokens)


def run_steps(n, token_base=20):
    """n rounds of: time passes, the worker answers (tokens from token_base on)."""
    b = b""
    for i in range(n):
        b += bytes([OP_TICK, 3]) + answer(0, [token_base + i + k for k in range(8)])
    return b


start = bytes([OP_TICK, 0, OP_HELLO]) + answer() + answer() + bytes([OP_TICK, 1]) + answer()
basic = bytes([0x41, 0x03, 0x20]) + start
basic += submit(1, list(range(3, 13)), 6)
basic += submit(2, list(range(3, 23)), 0, sampling=[2, 3, 9], stop=[2])
basic += run_steps(12)
basic += bytes([OP_CANCEL, 2]) + run_steps(3)
put("scheduler", "basic.bin", basic)

tight = bytes([0x00, 0x03, 0x08]) + start
for i in range(4):
    tight += submit(i, [(7 * i + k) % 200 + 3 for k in range(40)], 20)
tight += run_steps(30)
put("scheduler", "preemption.bin", tight)

tenancy = bytes([0x45, 0x13, 0x40]) + start
tenancy += bytes([OP_POLICY, 0x20 | 0x01, 4, 2, 2, 1, 0, 17] + list(tok(5) * 17) + [0])
tenancy += run_steps(4)
tenancy += submit(3, [5] * 17 + [9, 10], 4, tenant=0)
tenancy += submit(4, [5] * 17 + [11], 4, tenant=1)
tenancy += run_steps(8)
tenancy += bytes([OP_MISC, 2, OP_MISC, 3, OP_MISC, 3 | 8, OP_MISC, 1, OP_MISC, 0])
tenancy += bytes([OP_POLICY, 0x40, 0, 0, 0, 0, 0, 0, 0])
tenancy += run_steps(3)
put("scheduler", "tenancy.bin", tenancy)

faults = bytes([0x49, 0x01, 0x10]) + start
faults += submit(5, list(range(3, 20)), 10, output=[30, 31])
faults += bytes([OP_TICK, 1]) + answer(15)  # a step lost
faults += bytes([OP_TICK, 255, OP_TICK, 10]) + answer() + answer() + run_steps(2)
faults += bytes([OP_RESTART]) + answer() + answer() + run_steps(3)  # a new worker
faults += bytes([OP_TICK, 1]) + answer(14)  # the forward pass fails
faults += bytes([OP_RAW_WORKER, 4, 0, 0x5a, 0x02, 0x08, 0x07])  # a ResyncDone of epoch 7
faults += bytes([OP_RAW_ROUTER, 3, 0, 0xa2, 0x01, 0x00])  # a bare Submit
faults += bytes([OP_RAW_ROUTER, 2, 0, 0xff, 0xff])  # not a ToScheduler
faults += run_steps(4)
put("scheduler", "faults.bin", faults)

# Per-sequence failures (as pagoda-worker answers since the stall work): a row that cannot be
# sampled fails its sequence alone (how 13); a new worker on a new pool (kvpool restarted: the
# scheduler adopts the pool and resyncs, the resyncs of the old pool are refused); a resync
# answer that leaves a sequence out (how 12: ResyncDone.failed).
stall = bytes([0x49, 0x03, 0x20]) + start
stall += submit(6, list(range(3, 15)), 8)
stall += submit(7, list(range(20, 30)), 8)
stall += bytes([OP_TICK, 1]) + answer(13, [40, 41]) + run_steps(3)
stall += bytes([OP_NEW_POOL]) + answer() + answer() + answer() + run_steps(2)
stall += submit(8, list(range(30, 44)), 8)
stall += bytes([OP_TICK, 1]) + answer(15)  # a step lost: the scheduler resyncs
stall += bytes([OP_TICK, 255, OP_TICK, 10]) + answer(12) + answer() + run_steps(4)
put("scheduler", "stall.bin", stall)

# ---- the tokenizer (tokenizer/tokenizer.h): byte 0 + a tokenizer.json; byte 1 or 2 + text for
# fuzz_tokenizer.c's fixed byte-level or SentencePiece-style tokenizer ----
def gpt2_char(b):
    cp = 256 + b if b <= 32 else 289 + (b - 127) if 127 <= b <= 160 else 323 if b == 173 else b
    return chr(cp)


TOK_REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
             "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
bl_vocab = {gpt2_char(b): b for b in range(256)}
bl_vocab.update({"\u0120t": 256, "he": 257, "\u0120the": 258})
bytelevel_tok = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": 259, "content": "<|bos|>", "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True}],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": TOK_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
    "post_processor": {"type": "TemplateProcessing",
                       "single": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}},
                                  {"Sequence": {"id": "A", "type_id": 0}}],
                       "special_tokens": {"<|bos|>": {"id": "<|bos|>", "ids": [259],
                                                      "tokens": ["<|bos|>"]}}},
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "ignore_merges": True,
              "vocab": bl_vocab, "merges": [["\u0120", "t"], ["h", "e"], ["\u0120t", "he"]]},
}
sp_vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
sp_vocab.update({"<0x%02X>" % b: 3 + b for b in range(256)})
sp_vocab.update({"\u2581": 259, "a": 260, "\u2581a": 261})
sp_tok = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": 1, "content": "<s>", "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True}],
    "normalizer": None,
    "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                      "split": True},
    "post_processor": None,
    "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "fuse_unk": True,
              "byte_fallback": True, "vocab": sp_vocab, "merges": ["\u2581 a"]},
}
put("tokenizer", "bytelevel.json", b"\x00" + json.dumps(bytelevel_tok).encode())
put("tokenizer", "sentencepiece.json", b"\x00" + json.dumps(sp_tok).encode())
unsupported = dict(sp_tok, normalizer={"type": "Precompiled", "precompiled_charsmap": None})
put("tokenizer", "unsupported.json", b"\x00" + json.dumps(unsupported).encode())
put("tokenizer", "truncated.json", b"\x00" + json.dumps(sp_tok).encode()[:300])
put("tokenizer", "text_bytelevel.txt",
    b"\x01<|bos|>Hello, world! It's 12345 the <tool> x\n\n  \xf0\x9f\x98\x80 caf\xc3\xa9 \xe4\xb8\xad")
put("tokenizer", "text_sentencepiece.txt", b"\x02ab a\xc3\xa9 b  \xe2\x96\x81<s>\xf0\x9f\x91\x8d")
put("tokenizer", "text_invalid.txt", b"\x01ab\xe2\x82 \xff\xc0\xaf")
