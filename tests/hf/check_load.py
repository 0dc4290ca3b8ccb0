#!/usr/bin/env python3
"""Checks that Hugging Face transformers loads every model pagoda-mkmodel wrote, as intended.

Usage: python3 tests/hf/check_load.py MODELS_DIR   (MODELS_DIR from tests/hf/make_models.sh)

Runs where torch and transformers are installed (the GPU machine: torch 2.11, transformers
5.17); needs no network. For every model directory under MODELS_DIR:
  - AutoConfig and AutoModelForCausalLM.from_pretrained(dtype=float32) succeed, with no
    missing, unexpected or mismatched keys;
  - the loaded config agrees with config.json (class, sizes, eps, tied embeddings, rope type,
    theta and scaling, in either spelling), and the rotary embedding's inverse frequencies are
    the ones the rope type defines (computed here independently);
  - when tied, lm_head.weight is the embedding matrix itself;
  - every tensor in the safetensors files equals the model's parameter after bf16 -> f32, and
    a sharded model's index names every tensor and the right total size;
  - a forward pass on a few tokens gives finite logits whose spread across the vocabulary is
    not flat (standard deviation > 0.1 at every position).
Prints a table and exits 1 when any model failed.
"""
import json
import math
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

ARCH_CLASSES = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}
MIN_LOGIT_STD = 0.1
TOKENS = [1, 5, 9, 42, 7, 3, 100, 17]


class CheckError(Exception):
    pass


def expect(cond, what):
    if not cond:
        raise CheckError(what)


def close(a, b, rel=1e-9):
    return a == b or abs(a - b) <= rel * max(abs(a), abs(b))


def file_rope(cfg):
    """The rope description of a config.json, in either spelling, as one dict."""
    if isinstance(cfg.get("rope_parameters"), dict):
        rope = dict(cfg["rope_parameters"])
    else:
        rope = dict(cfg.get("rope_scaling") or {})
        if "rope_theta" in cfg:
            rope["rope_theta"] = cfg["rope_theta"]
    rope.setdefault("rope_type", rope.get("type", "default"))
    rope.setdefault("rope_theta", 10000.0)
    return rope


def loaded_rope(config):
    """The rope description transformers ended up with (rope_parameters in 5.x)."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and params:
        # A per-layer-type mapping ({"full_attention": {...}}) in some models.
        if "rope_type" not in params and len(params) == 1:
            params = next(iter(params.values()))
        rope = dict(params)
        if "rope_theta" not in rope and hasattr(config, "rope_theta"):
            rope["rope_theta"] = config.rope_theta
        return rope
    rope = dict(getattr(config, "rope_scaling", None) or {})
    rope.setdefault("rope_type", rope.get("type", "default"))
    rope.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return rope


def expected_inv_freq(rope, head_dim):
    """Inverse frequencies of the rope types pagoda supports, from their definitions."""
    theta = float(rope["rope_theta"])
    inv = [1.0 / theta ** (2 * i / head_dim) for i in range(head_dim // 2)]
    kind = rope["rope_type"]
    if kind == "default":
        return inv
    factor = float(rope["factor"])
    if kind == "linear":
        return [f / factor for f in inv]
    if kind == "llama3":
        low = float(rope["low_freq_factor"])
        high = float(rope["high_freq_factor"])
        old = float(rope["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old / low, old / high
        out = []
        for f in inv:
            wavelen = 2 * math.pi / f
            if wavelen < high_wavelen:
                out.append(f)
            elif wavelen > low_wavelen:
                out.append(f / factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                out.append((1 - smooth) * f / factor + smooth * f)
        return out
    raise CheckError(f"rope type {kind} is not one pagoda supports")


def check_config(cfg, config, model):
    arch = cfg["architectures"][0]
    expect(arch in ARCH_CLASSES, f"architecture {arch} is not one pagoda writes")
    expect(type(model).__name__ == arch, f"loaded {type(model).__name__}, config says {arch}")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
        expect(getattr(config, key) == cfg[key],
               f"{key}: loaded {getattr(config, key)}, config.json {cfg[key]}")
    expect(close(float(config.rms_norm_eps), float(cfg["rms_norm_eps"])), "rms_norm_eps differs")
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    loaded_head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads)
    expect(loaded_head_dim == head_dim, f"head_dim: loaded {loaded_head_dim}, expected {head_dim}")
    tied = bool(cfg.get("tie_word_embeddings", False))
    expect(bool(config.tie_word_embeddings) == tied, "tie_word_embeddings differs")
    q = model.model.layers[0].self_attn.q_proj
    expect(q.out_features == cfg["num_attention_heads"] * head_dim, "q_proj width differs")

    want, got = file_rope(cfg), loaded_rope(config)
    expect(got.get("rope_type") == want["rope_type"],
           f"rope type: loaded {got.get('rope_type')}, config.json {want['rope_type']}")
    for key in ("rope_theta", "factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings"):
        if key in want:
            expect(key in got and close(float(got[key]), float(want[key])),
                   f"rope {key}: loaded {got.get(key)}, config.json {want[key]}")
    rotary = getattr(model.model, "rotary_emb", None)
    expect(rotary is not None and hasattr(rotary, "inv_freq"), "no rotary_emb.inv_freq to check")
    inv = rotary.inv_freq.double().cpu().tolist()
    exp = expected_inv_freq(want, head_dim)
    expect(len(inv) == len(exp), "inv_freq length differs")
    worst = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(inv, exp))
    expect(worst < 1e-5, f"rotary inv_freq differs from the {want['rope_type']} formula "
                         f"(relative error {worst:.2e})")
    return tied, want


def check_tensors(path, model, tied):
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    expect(files, "no safetensors files")
    index_path = os.path.join(path, "model.safetensors.index.json")
    state = model.state_dict()
    seen = {}
    total = 0
    for name in files:
        for key, tensor in load_file(os.path.join(path, name)).items():
            expect(tensor.dtype == torch.bfloat16, f"{key}: stored as {tensor.dtype}, not bf16")
            expect(key not in seen, f"{key} stored twice ({seen.get(key)} and {name})")
            seen[key] = name
            total += tensor.numel() * tensor.element_size()
            expect(key in state, f"{key}: in {name} but not a parameter of the model")
            param = state[key]
            expect(tuple(param.shape) == tuple(tensor.shape),
                   f"{key}: model shape {tuple(param.shape)}, file {tuple(tensor.shape)}")
            expect(torch.equal(param.detach().cpu(), tensor.float()),
                   f"{key}: loaded values differ from the file's")
    if len(files) > 1 or os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        expect(index["weight_map"] == seen, "index weight_map differs from the files' tensors")
        expect(index["metadata"]["total_size"] == total,
               f"index total_size {index['metadata']['total_size']}, tensors hold {total}")
    expect(("lm_head.weight" in seen) != tied, "lm_head.weight presence disagrees with tying")
    if tied:
        lm, emb = model.lm_head.weight, model.model.embed_tokens.weight
        expect(lm is emb or lm.data_ptr() == emb.data_ptr(),
               "tied model: lm_head.weight is not the embedding matrix")
    return len(files)


def check_forward(model, vocab):
    ids = torch.tensor([[t % vocab for t in TOKENS]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    expect(tuple(logits.shape) == (1, len(TOKENS), vocab), f"logits shape {tuple(logits.shape)}")
    expect(bool(torch.isfinite(logits).all()), "logits are not all finite")
    spread = logits.std(dim=-1).min().item()
    expect(spread > MIN_LOGIT_STD, f"logits are flat (std across vocab {spread:.4f})")
    return spread


def check_model(path):
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    row = {"arch": cfg.get("model_type", "?"), "tied": "?", "shards": "?", "rope": "?"}
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        model, info = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, local_files_only=True, output_loading_info=True)
        model.eval()
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
            expect(not info.get(kind), f"{kind}: {sorted(info[kind])[:4]}")
        expect(type(config).__name__ == type(model.config).__name__, "config classes differ")
        tied, rope = check_config(cfg, model.config, model)
        row["tied"] = "yes" if tied else "no"
        row["rope"] = rope["rope_type"]
        if rope["rope_type"] != "default":
            row["rope"] += f" x{float(rope['factor']):g}"
        row["rope"] += " (legacy)" if "rope_parameters" not in cfg else ""
        row["shards"] = str(check_tensors(path, model, tied))
        spread = check_forward(model, cfg["vocab_size"])
        row["result"] = f"ok (logit std {spread:.2f})"
        return row, True
    except Exception as e:  # one model's failure must not hide the others'
        row["result"] = f"FAIL: {type(e).__name__}: {e}"
        return row, False


def main():
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} MODELS_DIR", file=sys.stderr)
        return 2
    root = sys.argv[1]
    hf_logging.disable_progress_bar()
    dirs = sorted(d for d in os.listdir(root)
                  if os.path.isfile(os.path.join(root, d, "config.json")))
    if not dirs:
        print(f"{sys.argv[0]}: no model directories in {root}", file=sys.stderr)
        return 1
    print(f"torch {torch.__version__}, transformers "
          f"{__import__('transformers').__version__}")
    header = ("model", "arch", "tied", "shards", "rope", "result")
    rows, failed = [], 0
    for d in dirs:
        row, ok = check_model(os.path.join(root, d))
        failed += not ok
        rows.append((d, row["arch"], row["tied"], row["shards"], row["rope"], row["result"]))
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header) - 1)]
    for r in [header] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) + "  " + str(r[-1]))
    print(f"{len(dirs) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
