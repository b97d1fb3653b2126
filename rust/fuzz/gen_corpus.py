#!/usr/bin/env python3
"""Writes the fuzz seed corpora from the golden vectors in spec/vectors (run from anywhere):
rust/fuzz/corpus/<target>/ for cargo-fuzz and go/testdata/fuzz/<FuzzName>/ for `go test -fuzz`.
Seeds are named after their vector; files the fuzzers add later are kept."""
import json
import os
import struct

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
VEC = os.path.join(ROOT, "spec", "vectors")


def vectors(name):
    with open(os.path.join(VEC, name)) as f:
        return json.load(f)


def rust(target, name, data):
    d = os.path.join(ROOT, "rust", "fuzz", "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def go(fuzz, name, *args):
    """A seed in the `go test fuzz v1` format; args are bytes (as []byte), ints (as uint32) or
    (type, int) pairs."""
    d = os.path.join(ROOT, "go", "testdata", "fuzz", fuzz)
    os.makedirs(d, exist_ok=True)
    lines = ["go test fuzz v1"]
    for a in args:
        if isinstance(a, bytes):
            lit = "".join(chr(c) if 0x20 <= c < 0x7F and c not in b'"\\' else "\\x%02x" % c for c in a)
            lines.append('[]byte("%s")' % lit)
        elif isinstance(a, tuple):
            lines.append("%s(%d)" % a)
        else:
            lines.append("uint32(%d)" % a)
    with open(os.path.join(d, "seed-" + name), "w") as f:
        f.write("\n".join(lines) + "\n")


def go_store(off, val):
    """A store of FuzzSegmentScribble: offset, then the value's low and high 32 bits."""
    return ("uint16", off), ("uint32", val & 0xFFFFFFFF), ("uint32", val >> 32)


def main():
    for v in vectors("handshake.json"):
        b = bytes.fromhex(v["hex"])
        rust("handshake", v["name"], b)
        go("FuzzDecodeMsg", v["name"], b)
    headers = [(v["name"], bytes.fromhex(v["hex"])) for v in vectors("header.json")]
    headers += [(v["name"], bytes.fromhex(v["hex"])) for v in vectors("header_invalid.json")]
    for name, b in headers:
        rust("header", name, b)
        go("FuzzDecodeHeader", name, b)
    for v in vectors("layout.json"):
        g = (v["ring_capacity"], v["slot_size"], v["slot_count"])
        name = "geometry_%d_%d_%d" % g
        rust("header", name, struct.pack("<3I", *g))
        go("FuzzGeometry", name, *g)
    # Hand-over records: a client's and a server's, an unknown role, and a file of three.
    rec = lambda ino, fds, role: struct.pack("<Q4iB7x", ino, *fds, role)
    recs = [rec(0x1234_5678_9ABC, (900, 901, 902, 903), 1), rec(77, (3, 4, 5, 6), 2), rec(1, (-1, 0, 0, 0), 7)]
    for i, r in enumerate(recs):
        rust("handover_record", "record%d" % i, r)
    rust("handover_record", "file", b"".join(recs) + b"\0" * 32)
    # The shim's offer requests: client|server, IPv4, IPv6, mapped, and a half one.
    for name, b in [("v4", b"127.0.0.1:40001|127.0.0.1:6379"), ("v6", b"[::1]:40001|[::1]:6379"),
                    ("mapped", b"[::ffff:127.0.0.1]:3|127.0.0.1:80"), ("half", b"127.0.0.1:1|")]:
        rust("offer_key", name, b)
    # Live segments: a geometry byte pair, then operations (see fuzz_targets/ring_scribble.rs).
    W, R, PEEK, LOOK, FLAGS, MSG, POP, FREE, FPOP, SCRIB = 0, 1, 2, 3, 4, 7, 8, 9, 10, 11
    u16 = lambda n: struct.pack("<H", n)
    u64 = lambda n: struct.pack("<Q", n)
    honest = bytes([W]) + u16(100) + bytes([R]) + u16(40) + bytes([PEEK]) + u16(100) + bytes([W]) + u16(5000) + bytes([R]) + u16(8000)
    queues = bytes([MSG, 1]) + u16(64) + bytes([POP, FREE, 1, FPOP, MSG, 200]) + u16(9999) + bytes([POP])
    rust("ring_scribble", "honest", bytes([0, 0]) + honest)
    rust("ring_scribble", "queues", bytes([5, 3]) + queues + honest)
    for name, off, val in [("head_far", 0, 1 << 40), ("tail_ahead", 128, 5000), ("flags_unknown", 8, 0x80),
                           ("msg_head", 256, 9), ("free_head", 512, 3), ("msg_entry", 768, 0xFFFF_FFFF_0000_1000)]:
        rust("ring_scribble", name, bytes([6, 4]) + honest + bytes([SCRIB]) + u16(off) + u64(val) + queues + bytes([LOOK]) + u64(0) + honest)
    rust("ring_scribble", "resume", bytes([1, 2]) + bytes([W]) + u16(300) + bytes([SCRIB]) + u16(0) + u64(299) + bytes([5, 6]) + honest)
    # Live connections (fuzz_targets/stream_scribble.rs): geometry bytes, then records of an
    # operation, a 16-bit offset and a 64-bit value; op 0 stores (bit 0x40: the server→client
    # block), 1 reads, 2 writes, 3 receives, 4 loans and sends, 5 releases, 6 shuts down;
    # bit 0x80: the client does it.
    rec = lambda op, off=0, val=0: bytes([op]) + u16(off) + u64(val)
    traffic = rec(2, 300) + rec(1, 200) + rec(4, 64) + rec(3) + rec(5) + rec(0x82, 100) + rec(0x81, 4000) + rec(6) + rec(0x81, 10)
    rust("stream_scribble", "honest", bytes([4, 3]) + traffic)
    for name, off, val in [("head_far", 0, 1 << 40), ("tail_back", 128, 1), ("flags_unknown", 8, 0x80),
                           ("msg_head", 256, 3), ("free_head", 512, 5), ("msg_entry", 768, 0xFFFF_FFFF_0000_0009)]:
        rust("stream_scribble", name, bytes([4, 3]) + rec(2, 300) + rec(4, 64) + rec(0, off, val) + rec(0x40, off, val) + traffic)
    # Go's FuzzSegmentScribble (go/fuzz_test.go): geometry byte, two stores (offset, value) and
    # operation bytes (0 the next store, 1 read, 2 write, 3 receive, 4 loan and send, 5 release,
    # 6 shut down, 7 receive, 8 push a message entry, 9 push a free entry; bit 7: the client does
    # it; bit 6: the server→client direction for 8 and 9).
    g_ops = bytes([2, 0x84, 1, 8, 3, 7, 5, 0, 0, 3, 1, 0x81, 4, 0x82, 9, 4, 4, 6, 0x81, 1])
    for name, off, val in [("head_far", 0, 1 << 40), ("tail_back", 128, 1), ("flags_unknown", 8, 0x80),
                           ("msg_head", 256, 3), ("free_head", 512, 1), ("free_entry", 768 + 8 * 3, 2),
                           ("s2c_head_far", 0x8000, 1 << 40), ("s2c_free_head", 0x8000 + 512, 5)]:
        go("FuzzSegmentScribble", name, ("byte", 13), *go_store(off, val), *go_store(256, 1), g_ops)
    go("FuzzSegmentScribble", "msg_entry", ("byte", 13), *go_store(768, (64 << 32) | 1), *go_store(256, 1), g_ops)
    for v in vectors("ring.json"):
        head, tail = int(v["head"]), int(v["tail"])
        rust("ring_scribble", "vector_%d_%d" % (head % 100000, tail % 100000),
             bytes([0, 0, SCRIB]) + u16(0) + u64(head) + bytes([SCRIB]) + u16(128) + u64(tail) + bytes([LOOK]) + u64(tail) + honest)
        go("FuzzSegmentScribble", "vector_%d_%d" % (head % 100000, tail % 100000),
           ("byte", 0), *go_store(0, head), *go_store(128, tail), bytes([0, 0, 1, 2, 1]))


main()
