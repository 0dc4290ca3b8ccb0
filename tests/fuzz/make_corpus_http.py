#!/usr/bin/env python3
"""Writes fuzz_http's seed corpus (tests/fuzz/corpus/http/): scripts of a handler mode byte and
commands (a length byte 1..0xF0 and that many request bytes; 0xF1 the timer; 0xF2 answer the
held request; 0xF3 stream on it; 0xF4 end the stream), the mode byte's bit 2 a server allowing a
list of origins, as tests/fuzz/fuzz_http.c reads them; and
fuzz_openai's (tests/fuzz/corpus/openai/): a kind byte (0 completion, 1 chat, 2 /tokenize,
3 /detokenize) and a request body, as tests/fuzz/fuzz_openai.c reads them."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "http")

RESPOND, STREAM, HOLD, BAD_HEADERS = 0, 1, 2, 3
CORS = 4  # with a mode: the server allows https://a.example and http://b.example:8080


def feed(data: bytes, piece: int = 0xF0) -> bytes:
    out = b""
    for i in range(0, len(data), piece):
        part = data[i:i + piece]
        out += bytes([len(part)]) + part
    return out


GET = b"GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n"
POST = (b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
        b"Content-Length: 17\r\n\r\n{\"prompt\":\"hi\"}\n\n")
CHUNKED = (b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nTrailer: t\r\n\r\n")

SEEDS = {
    "get_respond.bin": bytes([RESPOND]) + feed(GET),
    "keepalive_three.bin": bytes([RESPOND]) + feed(GET * 3, 7),
    "post_stream.bin": bytes([STREAM]) + feed(POST, 13),
    "chunked_hold_answer.bin": bytes([HOLD]) + feed(CHUNKED, 5) + b"\xf2" + feed(GET) + b"\xf2",
    "hold_stream_end.bin": bytes([HOLD]) + feed(GET) + b"\xf3\xf3\xf4" + feed(GET) + b"\xf2",
    "bad_headers.bin": bytes([BAD_HEADERS]) + feed(GET) + b"\xf2",
    "http10.bin": bytes([STREAM]) + feed(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"),
    "head.bin": bytes([RESPOND]) + feed(b"HEAD /x HTTP/1.1\r\n\r\n"),
    "expect.bin": bytes([RESPOND]) + feed(
        b"POST /e HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n") + feed(b"ok"),
    "slow.bin": bytes([RESPOND]) + feed(b"GET / HTTP/1.1\r\nHo") + b"\xf1",
    "malformed.bin": bytes([RESPOND]) + feed(b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n"),
    "bad_chunk.bin": bytes([RESPOND]) + feed(
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
    "too_big.bin": bytes([RESPOND]) + feed(
        b"POST / HTTP/1.1\r\nContent-Length: 100000\r\n\r\n"),
    "big_header.bin": bytes([RESPOND]) + feed(b"GET / HTTP/1.1\r\nX: " + b"a" * 600 + b"\r\n\r\n"),
    "pipelined_hold.bin": bytes([HOLD]) + feed(GET + POST) + b"\xf2\xf2",
    "upgrade.bin": bytes([RESPOND]) + feed(
        b"GET / HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\nrest"),
    "cors_get.bin": bytes([RESPOND | CORS]) + feed(
        b"GET / HTTP/1.1\r\nOrigin: https://a.example\r\n\r\n"),
    "cors_too_big.bin": bytes([RESPOND | CORS]) + feed(
        b"POST / HTTP/1.1\r\nOrigin: http://b.example:8080\r\nContent-Length: 100000\r\n\r\n"),
    "cors_origin_in_part.bin": bytes([HOLD | CORS]) + feed(
        b"GET / HTTP/1.1\r\nOrigin: https://a.exa") + b"\xf1",
}

os.makedirs(OUT, exist_ok=True)
for name, data in SEEDS.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print(f"{len(SEEDS)} seeds in {OUT}")

COMPLETION, CHAT, TOKENIZE, DETOKENIZE = 0, 1, 2, 3
OPENAI = {
    "completion.bin": (COMPLETION, b'{"model": "m", "prompt": "Hello", "max_tokens": 7, '
                       b'"temperature": 0.5, "top_p": 0.9, "seed": 3, "stop": ["a", "bc"], '
                       b'"stream": true, "stream_options": {"include_usage": true}, '
                       b'"logprobs": 1, "n": 2}'),
    "completion_ids.bin": (COMPLETION, b'{"prompt": [1, 2, 3], "stop_token_ids": [4], '
                           b'"return_tokens_as_token_ids": true, "logprobs": 0}'),
    "prompt_list.bin": (COMPLETION, b'{"prompt": ["one", "two", "three"], "n": 3, "seed": 9}'),
    "prompt_id_lists.bin": (COMPLETION, b'{"prompt": [[1, 2], [3], [4, 5, 6]], '
                            b'"add_special_tokens": false}'),
    "mixed_list.bin": (COMPLETION, b'{"prompt": ["a", [1]]}'),
    "chat.bin": (CHAT, b'{"messages": [{"role": "system", "content": "s"}, {"role": "user", '
                 b'"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, '
                 b'{"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": '
                 b'"function", "function": {"name": "f", "arguments": "{\\"x\\": 1}"}}]}], '
                 b'"tools": [{"type": "function", "function": {"name": "f"}}], '
                 b'"chat_template_kwargs": {"enable_thinking": false}, "logprobs": true, '
                 b'"max_completion_tokens": 5, "top_k": 3, "min_p": 0.1}'),
    "tokenize.bin": (TOKENIZE, b'{"prompt": "", "add_special_tokens": true}'),
    "tokenize_chat.bin": (TOKENIZE, b'{"messages": [{"role": "user", "content": "x"}], '
                          b'"add_generation_prompt": false}'),
    "detokenize.bin": (DETOKENIZE, b'{"tokens": [1, 2, 3], "skip_special_tokens": true}'),
    "unsupported.bin": (COMPLETION, b'{"prompt": "x", "logit_bias": {"1": 2}, "echo": true}'),
    "logit_bias.bin": (COMPLETION, b'{"prompt": "x", "logit_bias": {"50256": -100, "7": 150, '
                       b'"+01": "2.5", "3": -1e9}, "min_tokens": 5, "max_tokens": 5}'),
    "logit_bias_chat.bin": (CHAT, b'{"messages": [{"role": "user", "content": "x"}], '
                            b'"logit_bias": {"0": 1, "12": "0.5"}, "min_tokens": "2"}'),
    "logit_bias_twice.bin": (COMPLETION, b'{"prompt": "x", "logit_bias": {"9": 1, "009": 2}}'),
    "min_tokens_over.bin": (COMPLETION, b'{"prompt": "x", "min_tokens": 17}'),
}
OUT_OPENAI = os.path.join(HERE, "corpus", "openai")
os.makedirs(OUT_OPENAI, exist_ok=True)
for name, (kind, body) in OPENAI.items():
    with open(os.path.join(OUT_OPENAI, name), "wb") as f:
        f.write(bytes([kind]) + body)
print(f"{len(OPENAI)} seeds in {OUT_OPENAI}")
