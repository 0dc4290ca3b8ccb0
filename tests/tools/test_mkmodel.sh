#!/usr/bin/env bash
# Tests of pagoda-mkmodel and pagoda-model-info together: every shape mkmodel can write loads
# through pagoda's loader and is described as asked; output is a pure function of the flags;
# bad flags are refused by name; and broken models (made from mkmodel's output) are refused by
# the loader with a message that names the problem, never with a crash.
# Usage: tests/tools/test_mkmodel.sh BINDIR
set -euo pipefail
bin=${1:?usage: $0 BINDIR}
mkmodel=$bin/pagoda-mkmodel
info=$bin/pagoda-model-info
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# shellcheck source=tests/check.sh
. "$(dirname "$0")/../check.sh"
ok() {
    passed=$((passed + 1))
    echo "ok   $1"
}
bad() {
    failed=$((failed + 1))
    echo "FAIL $1"
    [[ -f $tmp/err ]] && sed 's/^/     /' "$tmp/err" | head -5
    return 0
}

# Small shapes keep the whole test well under a second per model.
small=(--vocab 256 --hidden 64 --intermediate 96 --layers 2 --heads 4 --kv-heads 2)

# mk NAME FLAGS...: writes $tmp/NAME; remembers mkmodel's parameter count in $tmp/NAME.params.
mk() {
    local name=$1
    shift
    if "$mkmodel" --out "$tmp/$name" "$@" >"$tmp/out" 2>"$tmp/err"; then
        sed -n 's/.* \([0-9]*\) parameters.*/\1/p' "$tmp/out" >"$tmp/$name.params"
        return 0
    fi
    bad "mkmodel $name $*"
    return 1
}

# expect_info NAME KEY=VALUE...: pagoda-model-info --json loads $tmp/NAME and each KEY (dots
# for nesting) has VALUE (compared as JSON text, strings without quotes).
expect_info() {
    local name=$1
    shift
    if ! "$info" --json "$tmp/$name" >"$tmp/info.json" 2>"$tmp/err"; then
        bad "model-info loads $name"
        return 0
    fi
    if python3 - "$tmp/info.json" "$@" >"$tmp/err" 2>&1 <<'EOF'; then
import json, sys
doc = json.load(open(sys.argv[1]))
wrong = []
for pair in sys.argv[2:]:
    key, want = pair.split("=", 1)
    v = doc
    for part in key.split("."):
        v = v[part]
    got = v if isinstance(v, str) else json.dumps(v)
    if isinstance(v, float) and not isinstance(v, bool):
        ok = float(want) == v
    else:
        ok = got == want
    if not ok:
        wrong.append(f"{key}: got {got}, want {want}")
if wrong:
    print("\n".join(wrong))
    sys.exit(1)
EOF
        ok "model-info $name: $*"
    else
        bad "model-info $name: $*"
    fi
}

# expect_load_error NAME TEXT...: pagoda-model-info refuses $tmp/NAME with exit status 1 (not a
# signal) and a message containing every TEXT.
expect_load_error() {
    local name=$1
    shift
    local rc=0
    "$info" "$tmp/$name" >/dev/null 2>"$tmp/err" || rc=$?
    if [[ $rc -ne 1 ]]; then
        bad "model-info refuses $name with exit 1 (got $rc)"
        return 0
    fi
    for text in "$@"; do
        if ! grep -qF -- "$text" "$tmp/err"; then
            bad "model-info $name: message names '$text'"
            return 0
        fi
    done
    if ! grep -q '^pagoda-model-info: ' "$tmp/err"; then
        bad "model-info $name: message starts with the program name"
        return 0
    fi
    ok "model-info refuses $name: $(head -c 150 "$tmp/err")"
}

# expect_flag_error FLAG ARGS...: mkmodel refuses ARGS with exit status 2, names FLAG, and
# writes nothing.
expect_flag_error() {
    local flag=$1
    shift
    local rc=0
    "$mkmodel" --out "$tmp/refused" "$@" >/dev/null 2>"$tmp/err" || rc=$?
    if [[ $rc -eq 2 ]] && grep -qF -- "$flag" "$tmp/err" && [[ ! -e $tmp/refused ]]; then
        ok "mkmodel refuses $* ($(head -c 100 "$tmp/err"))"
    else
        bad "mkmodel refuses $* with exit 2 naming $flag (got $rc)"
    fi
}

# -- every architecture, tied and untied --
for arch in llama mistral qwen2; do
    for tie in false true; do
        name=$arch-tie-$tie
        bias=false
        [[ $arch == qwen2 ]] && bias=true
        class=$(python3 -c "print({'llama':'Llama','mistral':'Mistral','qwen2':'Qwen2'}['$arch'] + 'ForCausalLM')")
        mk "$name" --arch "$arch" "${small[@]}" --tie-embeddings="$tie" --seed 7 || continue
        expect_info "$name" architecture="$class" model_type="$arch" num_layers=2 hidden_size=64 \
            num_heads=4 num_kv_heads=2 head_dim=16 intermediate_size=96 vocab_size=256 \
            tie_word_embeddings="$tie" lm_head_shared="$tie" qkv_bias="$bias" o_bias=false dtype=bfloat16 \
            weight_dtypes=BF16 shards=1 parameters="$(cat "$tmp/$name.params")"
    done
done

# -- the tiny preset, Llama attention bias, an explicit head dim, MHA, token ids --
mk tiny --preset tiny &&
    expect_info tiny vocab_size=512 hidden_size=256 num_layers=4 num_heads=4 num_kv_heads=2 \
        head_dim=64 intermediate_size=688 rope.theta=10000 bos_token_id=1 eos_token_ids='[2]' \
        tie_word_embeddings=false parameters="$(cat "$tmp/tiny.params")"
mk bias "${small[@]}" --attention-bias && expect_info bias qkv_bias=true o_bias=true \
    parameters="$(cat "$tmp/bias.params")"
mk headdim "${small[@]}" --head-dim 32 && expect_info headdim head_dim=32 hidden_size=64
mk mha "${small[@]}" --kv-heads 4 && expect_info mha num_kv_heads=4
mk tokens "${small[@]}" --bos 0 --eos 3,4,5 --rms-eps 1e-6 --max-positions 512 &&
    expect_info tokens bos_token_id=0 eos_token_ids='[3, 4, 5]' rms_norm_eps=1e-6 \
        max_position_embeddings=512

# -- RoPE: both spellings, every type --
mk rope-default-legacy "${small[@]}" --rope-theta 500000 --legacy-rope &&
    expect_info rope-default-legacy rope.type=default rope.theta=500000 rope.factor=1
mk rope-linear "${small[@]}" --rope-type linear --rope-factor 4 &&
    expect_info rope-linear rope.type=linear rope.factor=4
mk rope-linear-legacy "${small[@]}" --rope-type linear --rope-factor 4 --legacy-rope &&
    expect_info rope-linear-legacy rope.type=linear rope.factor=4
for spelling in params legacy; do
    extra=()
    [[ $spelling == legacy ]] && extra=(--legacy-rope)
    mk "llama3-$spelling" "${small[@]}" --rope-type llama3 --rope-factor 8 \
        --rope-low-freq-factor 1 --rope-high-freq-factor 4 --rope-original-max-positions 8192 \
        --max-positions 131072 --rope-theta 500000 "${extra[@]}" &&
        expect_info "llama3-$spelling" rope.type=llama3 rope.theta=500000 rope.factor=8 \
            rope.low_freq_factor=1 rope.high_freq_factor=4 \
            rope.original_max_position_embeddings=8192 max_position_embeddings=131072
done
if python3 -c '
import json, sys
p = json.load(open(sys.argv[1])); l = json.load(open(sys.argv[2]))
assert p["rope_parameters"]["rope_type"] == "llama3" and "rope_scaling" not in p
assert l["rope_scaling"]["rope_type"] == "llama3" and l["rope_theta"] == 500000
assert "rope_parameters" not in l' "$tmp/llama3-params/config.json" \
    "$tmp/llama3-legacy/config.json" 2>"$tmp/err"; then
    ok "--legacy-rope writes rope_theta + rope_scaling, otherwise rope_parameters"
else
    bad "--legacy-rope writes rope_theta + rope_scaling, otherwise rope_parameters"
fi

# -- shards --
mk sharded "${small[@]}" --shards 3 --seed 7 &&
    expect_info sharded shards=3 parameters="$(cat "$tmp/sharded.params")"
mk unsharded "${small[@]}" --seed 7 || true
if python3 - "$tmp/sharded" "$tmp/unsharded" >"$tmp/err" 2>&1 <<'EOF'; then
import json, os, struct, sys

def tensors(d):
    out, sizes = {}, {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        b = open(os.path.join(d, f), "rb").read()
        n = struct.unpack("<Q", b[:8])[0]
        assert n % 8 == 0, f"{f}: header length {n} not a multiple of 8"
        h = json.loads(b[8:8 + n])
        assert h.pop("__metadata__") == {"format": "pt"}
        end = 0
        for k, v in h.items():
            assert v["dtype"] == "BF16"
            s, e = v["data_offsets"]
            assert s == end, f"{k}: data not contiguous"
            end = e
            out[k] = b[8 + n + s:8 + n + e]
        assert 8 + n + end == len(b), f"{f}: trailing bytes"
        sizes[f] = end
    return out, sizes

a, sizes = tensors(sys.argv[1])
b, _ = tensors(sys.argv[2])
assert a == b, "sharding changed tensor values"
assert len(sizes) == 3, sizes
index = json.load(open(os.path.join(sys.argv[1], "model.safetensors.index.json")))
assert index["metadata"]["total_size"] == sum(sizes.values())
assert set(index["weight_map"]) == set(a)
assert sorted(set(index["weight_map"].values())) == [
    f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]
# Roughly even by bytes: no shard more than twice the mean.
mean = sum(sizes.values()) / 3
assert max(sizes.values()) < 2 * mean, sizes
EOF
    ok "--shards 3: index, even split, same tensor values as one file"
else
    bad "--shards 3: index, even split, same tensor values as one file"
fi

# -- determinism --
mk det-a "${small[@]}" --arch qwen2 --seed 42 --shards 2 || true
mk det-b "${small[@]}" --arch qwen2 --seed 42 --shards 2 || true
mk det-c "${small[@]}" --arch qwen2 --seed 43 --shards 2 || true
same=1
for f in "$tmp"/det-a/*; do
    cmp -s "$f" "$tmp/det-b/$(basename "$f")" || same=0
done
if [[ $same -eq 1 ]]; then ok "same seed: byte-identical files"; else bad "same seed: byte-identical files"; fi
if ! cmp -s "$tmp/det-a/model-00001-of-00002.safetensors" \
    "$tmp/det-c/model-00001-of-00002.safetensors" &&
    cmp -s "$tmp/det-a/config.json" "$tmp/det-c/config.json"; then
    ok "different seed: different weights, same config"
else
    bad "different seed: different weights, same config"
fi

# -- refused flags: exit 2, the flag named, nothing written --
expect_flag_error --heads "${small[@]}" --heads 3
expect_flag_error --heads --hidden 256 --heads 3
expect_flag_error --kv-heads --heads 4 --kv-heads 3
expect_flag_error --rope-type --rope-type yarn
expect_flag_error --shards --shards 0
expect_flag_error --shards "${small[@]}" --shards 1000
expect_flag_error --arch --arch gpt2
expect_flag_error --vocab --vocab 0
expect_flag_error --hidden --hidden abc
expect_flag_error --rms-eps --rms-eps -1
expect_flag_error --eos --eos 1,99999
expect_flag_error --bos --vocab 100 --bos 100
expect_flag_error --rope-factor --rope-factor 2
expect_flag_error --rope-low-freq-factor --rope-type linear --rope-low-freq-factor 2
expect_flag_error --rope-high-freq-factor --rope-type llama3 --rope-low-freq-factor 4 \
    --rope-high-freq-factor 1
expect_flag_error --attention-bias --arch mistral --attention-bias
expect_flag_error --tie-embeddings --tie-embeddings=maybe
expect_flag_error --seed --seed -1
expect_flag_error --preset --preset huge
expect_flag_error --bogus --bogus
expect_flag_error --head-dim "${small[@]}" --head-dim 15
rc=0
"$mkmodel" "${small[@]}" >/dev/null 2>"$tmp/err" || rc=$?
if [[ $rc -eq 2 ]] && grep -qF -- --out "$tmp/err"; then ok "mkmodel requires --out"; else bad "mkmodel requires --out"; fi

# -- an existing directory: refused unless --force, which replaces the old model's files --
rc=0
"$mkmodel" --out "$tmp/sharded" "${small[@]}" >/dev/null 2>"$tmp/err" || rc=$?
if [[ $rc -ne 0 ]] && grep -qF -- --force "$tmp/err"; then
    ok "non-empty --out refused without --force"
else
    bad "non-empty --out refused without --force (rc $rc)"
fi
cp -r "$tmp/sharded" "$tmp/forced"
echo keep >"$tmp/forced/README.md"
if "$mkmodel" --out "$tmp/forced" "${small[@]}" --force >/dev/null 2>"$tmp/err" &&
    [[ -f $tmp/forced/model.safetensors && -f $tmp/forced/README.md ]] &&
    [[ ! -e $tmp/forced/model.safetensors.index.json ]] &&
    ! ls "$tmp/forced" | grep -q -- '-of-'; then
    ok "--force replaces the model files and keeps the others"
else
    bad "--force replaces the model files and keeps the others"
fi
expect_info forced shards=1

# A config that ties embeddings over a checkpoint that has its own lm_head.weight: transformers
# then unties (and warns); the loader must use the checkpoint's lm_head.weight too.
cp -r "$tmp/llama-tie-false" "$tmp/tie-flipped"
sed -i 's/"tie_word_embeddings": false/"tie_word_embeddings": true/' "$tmp/tie-flipped/config.json"
expect_info tie-flipped tie_word_embeddings=true lm_head_shared=false

# -- broken models: refused with exit 1 and a message naming the problem --
cp -r "$tmp/llama-tie-false" "$tmp/truncated"
st=$tmp/truncated/model.safetensors
truncate -s $(($(stat -c %s "$st") / 2)) "$st"
expect_load_error truncated truncated model.safetensors

cp -r "$tmp/llama-tie-false" "$tmp/stub"
truncate -s 5 "$tmp/stub/model.safetensors"
expect_load_error stub truncated model.safetensors

cp -r "$tmp/llama-tie-false" "$tmp/cut-header"
truncate -s 100 "$tmp/cut-header/model.safetensors"
expect_load_error cut-header truncated model.safetensors

cp -r "$tmp/sharded" "$tmp/missing-shard"
rm "$tmp/missing-shard/model-00002-of-00003.safetensors"
expect_load_error missing-shard model-00002-of-00003.safetensors

cp -r "$tmp/sharded" "$tmp/truncated-shard"
truncate -s 1000 "$tmp/truncated-shard/model-00003-of-00003.safetensors"
expect_load_error truncated-shard truncated model-00003-of-00003.safetensors

cp -r "$tmp/llama-tie-false" "$tmp/shape"
sed -i 's/"intermediate_size": 96/"intermediate_size": 128/' "$tmp/shape/config.json"
expect_load_error shape mlp. '[96, 64]' '[128, 64]'

cp -r "$tmp/llama-tie-false" "$tmp/vocab"
sed -i 's/"vocab_size": 256/"vocab_size": 300/' "$tmp/vocab/config.json"
expect_load_error vocab '[256, 64]' '[300, 64]'

cp -r "$tmp/llama-tie-false" "$tmp/renamed"
python3 - "$tmp/renamed/model.safetensors" <<'EOF'
import sys
p = sys.argv[1]
b = open(p, "rb").read()
assert b.count(b'"model.norm.weight"') == 1
open(p, "wb").write(b.replace(b'"model.norm.weight"', b'"model.norX.weight"'))
EOF
expect_load_error renamed model.norm.weight

cp -r "$tmp/llama-tie-false" "$tmp/layers"
sed -i 's/"num_hidden_layers": 2/"num_hidden_layers": 3/' "$tmp/layers/config.json"
expect_load_error layers model.layers.2.

cp -r "$tmp/llama-tie-false" "$tmp/fewer-layers"
sed -i 's/"num_hidden_layers": 2/"num_hidden_layers": 1/' "$tmp/fewer-layers/config.json"
expect_load_error fewer-layers model.layers.1.

cp -r "$tmp/llama-tie-true" "$tmp/untied"
sed -i 's/"tie_word_embeddings": true/"tie_word_embeddings": false/' "$tmp/untied/config.json"
expect_load_error untied lm_head.weight

cp -r "$tmp/qwen2-tie-false" "$tmp/no-bias"
python3 - "$tmp/no-bias/config.json" <<'EOF'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c.update(architectures=["LlamaForCausalLM"], model_type="llama")
for k in ("use_sliding_window", "sliding_window", "max_window_layers"):
    c.pop(k)
json.dump(c, open(p, "w"))
EOF
expect_load_error no-bias bias

cp -r "$tmp/llama-tie-false" "$tmp/bad-header"
printf '\xff\xff\xff\xff\xff\xff\xff\x7f' | dd of="$tmp/bad-header/model.safetensors" bs=1 \
    conv=notrunc status=none
expect_load_error bad-header model.safetensors header

cp -r "$tmp/llama-tie-false" "$tmp/bad-config"
echo '{"architectures": ["LlamaForCausalLM"], ' >"$tmp/bad-config/config.json"
expect_load_error bad-config config.json

cp -r "$tmp/llama-tie-false" "$tmp/yarn"
python3 - "$tmp/yarn/config.json" <<'EOF'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
json.dump(c, open(p, "w"))
EOF
expect_load_error yarn yarn

mkdir "$tmp/empty"
cp "$tmp/llama-tie-false/config.json" "$tmp/empty/"
expect_load_error empty model.safetensors
expect_load_error does-not-exist config.json

check_summary
