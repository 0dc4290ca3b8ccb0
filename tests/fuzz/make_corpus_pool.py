#!/usr/bin/env python3
"""Writes the seed corpora of fuzz_kvpool_request, fuzz_kvpool_response, fuzz_kv_shm_pool and
fuzz_supervisor_control into tests/fuzz/corpus/: valid inputs and near-valid ones (one thing
wrong each). The protobuf messages are encoded here by hand, field numbers as in
proto/internal.proto. Deterministic: running it again writes the same bytes.

    tests/fuzz/make_corpus_pool.py [OUT_DIR]   (default: tests/fuzz/corpus)
"""
import os
import struct
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def varint(v):
    v &= (1 << 64) - 1  # negative int32 values are sign-extended to 10 bytes
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def vfield(num, v):
    return varint(num << 3) + varint(v)


def lfield(num, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(num << 3 | 2) + varint(len(data)) + data


# ---- KvpoolRequest: protocol_version 1, geometry 2, worker_id 3 ----
put("kvpool_request", "geometry.bin", vfield(1, 1) + vfield(2, 1))
put("kvpool_request", "worker.bin", vfield(1, 1) + vfield(2, 1) + vfield(3, 0))
put("kvpool_request", "worker_only.bin", vfield(1, 1) + vfield(3, 7))
put("kvpool_request", "empty.bin", b"")
put("kvpool_request", "truncated.bin", vfield(1, 1) + b"\x10")
put("kvpool_request", "bad_wire_type.bin", b"\x0f\x01")

# ---- KvpoolResponse: protocol_version 1, error_code 2, error_message 3, geometry 4 ----
# PoolGeometry: pool_id 1, num_layers 2, num_blocks 3, block_size 4, num_kv_heads 5, head_dim 6,
# dtype 7, shm_name 8, device 9, handle_socket 10.
GEOM = dict(pool_id=0x1234, num_layers=2, num_blocks=64, block_size=16, num_kv_heads=2,
            head_dim=64, dtype=0)
ORDER = ["pool_id", "num_layers", "num_blocks", "block_size", "num_kv_heads", "head_dim", "dtype"]


def geometry(shm="/pagoda-pool", device=None, sock=None, drop=None, **changes):
    g = dict(GEOM, **changes)
    b = b"".join(vfield(i + 1, g[k]) for i, k in enumerate(ORDER) if k != drop)
    if shm is not None:
        b += lfield(8, shm)
    if device is not None:
        b += vfield(9, device)
    if sock is not None:
        b += lfield(10, sock)
    return b


def response(geom=None, code=None, message=None):
    b = vfield(1, 1)
    if code is not None:
        b += vfield(2, code)
    if message is not None:
        b += lfield(3, message)
    if geom is not None:
        b += lfield(4, geom)
    return b


R = "kvpool_response"
put(R, "cpu.bin", response(geometry()))
put(R, "gpu.bin", response(geometry(shm=None, device=0, sock="/tmp/run/kvpool-fds.sock")))
put(R, "busy.bin", response(code=-14, message="not ready"))
put(R, "refused.bin", response(code=-6, message="malformed KvpoolRequest"))
put(R, "code_positive.bin", response(code=5, message="odd"))
put(R, "code_unknown.bin", response(code=-1000))
put(R, "no_geometry.bin", response())
put(R, "missing_field.bin", response(geometry(drop="head_dim")))
put(R, "dtype.bin", response(geometry(dtype=7)))
put(R, "one_block.bin", response(geometry(num_blocks=1)))
put(R, "huge.bin", response(geometry(num_layers=2**31 - 1, num_blocks=2**31 - 1)))
put(R, "negative.bin", response(geometry(num_kv_heads=-1)))
put(R, "no_location.bin", response(geometry(shm=None)))
put(R, "gpu_no_device.bin", response(geometry(shm=None, sock="/s")))
put(R, "gpu_negative_device.bin", response(geometry(shm=None, device=-2, sock="/s")))
put(R, "long_name.bin", response(geometry(shm="/" + "n" * 200)))
put(R, "long_socket.bin", response(geometry(shm=None, device=0, sock="/" + "s" * 120)))
put(R, "both.bin", response(geometry(shm="/p", device=1, sock="/s")))

# ---- a CPU pool segment (kvpool/shm_pool.h): 4 bytes of segment size, then the contents ----
MAGIC, LAYOUT, READY, HEADER_BYTES, ALIGN = 0x4C4F4F50564B4750, 1, 0x59444552, 80, 4096


def pool_bytes(g):
    esize = 4 if g["dtype"] == 2 else 2
    return (g["num_layers"] * g["num_blocks"] * 2 * g["num_kv_heads"] * g["block_size"] *
            g["head_dim"] * esize)


def segment(ready=READY, magic=MAGIC, layout=LAYOUT, header_bytes=HEADER_BYTES, offset=ALIGN,
            data_bytes=None, total=None, size=None, **changes):
    g = dict(num_layers=2, num_blocks=4, block_size=8, num_kv_heads=1, head_dim=4, dtype=0,
             pool_id=0xABCD)
    g.update(changes)
    n = pool_bytes(g) if data_bytes is None else data_bytes
    t = offset + n if total is None else total
    h = struct.pack("<QIIQQQQiiiiiiII", magic, layout, header_bytes, offset, n, t, g["pool_id"],
                    g["num_layers"], g["num_blocks"], g["block_size"], g["num_kv_heads"],
                    g["head_dim"], g["dtype"], ready, 0)
    assert len(h) == HEADER_BYTES
    return struct.pack("<I", t if size is None else size) + h


S = "kv_shm_pool"
put(S, "valid.bin", segment())
put(S, "valid_f32.bin", segment(dtype=2, num_layers=3, head_dim=8))
put(S, "valid_offset.bin", segment(offset=2 * ALIGN))
put(S, "not_ready.bin", segment(ready=0))
put(S, "empty_header.bin", struct.pack("<I", 8192))
put(S, "short.bin", struct.pack("<I", 40) + bytes(40))
put(S, "magic.bin", segment(magic=1))
put(S, "layout.bin", segment(layout=2))
put(S, "header_bytes.bin", segment(header_bytes=96))
put(S, "bad_geometry.bin", segment(num_blocks=1))
put(S, "misaligned.bin", segment(offset=ALIGN + 8))
put(S, "offset_far.bin", segment(offset=2 << 20))
put(S, "data_bytes.bin", segment(data_bytes=64))
put(S, "total.bin", segment(total=ALIGN))
put(S, "truncated.bin", segment(size=ALIGN + 16))
put(S, "longer.bin", segment(size=ALIGN + 4 * 1024 * 1024))

# ---- Control: protocol_version 1, hung_worker_id 2, hung_worker_pid 3, ready 4, sender 5,
# heartbeat 6 ----
C = "supervisor_control"
for s in ["kvpool", "scheduler", "router", "worker", "worker-0", "worker-63"]:
    put(C, "ready_" + s + ".bin", vfield(1, 1) + vfield(4, 1) + lfield(5, s))
put(C, "heartbeat.bin", vfield(1, 1) + vfield(6, 1) + lfield(5, "router"))
put(C, "hung.bin", vfield(1, 1) + vfield(2, 0) + vfield(3, 4242) + lfield(5, "scheduler"))
for s in ["worker-64", "worker--1", "worker-", "worker-1x", "worker-+1", "worker- 1",
          "worker-0099", "Router", "kvpool\x00x", "worker-99999999999999999999"]:
    put(C, "sender_" + s.encode().hex() + ".bin", vfield(4, 1) + lfield(5, s))
put(C, "negative_pid.bin", vfield(2, 2**32 - 1) + vfield(3, -1))
put(C, "truncated.bin", vfield(4, 1) + b"\x2a\x10ab")
