#!/usr/bin/env python3
"""Writes the golden vectors of spec/WIRE.md. Independent of every implementation: run it only when
the spec changes, and check the output in. Every implementation's tests read the JSON files."""
import json, struct, ipaddress, os

HERE = os.path.dirname(os.path.abspath(__file__))
MAGIC = 0x4F4C4F43

def msg(typ, version, arg, flags=0, ticket=0):
    return struct.pack('<IBBBBII', MAGIC, typ, version, arg, 0, flags, ticket)

def round_up(x, a):
    return (x + a - 1) // a * a

def layout(cap, slot_size, slot_count):
    data_off = round_up(768 + 12 * slot_count, 1024)
    pool_off = round_up(data_off + cap, 4096)
    block = round_up(pool_off + slot_count * slot_size, 4096)
    return dict(ring_capacity=cap, slot_size=slot_size, slot_count=slot_count, data_off=data_off,
                pool_off=pool_off, block_size=block, segment_size=1024 + 2 * block)

def addr(family, ip, port):
    raw = ipaddress.ip_address(ip).packed if family else b''
    return struct.pack('<HH16sI', family, port, raw.ljust(16, b'\0'), 0)

def write(name, obj):
    with open(os.path.join(HERE, name), 'w') as f:
        json.dump(obj, f, indent=1)
        f.write('\n')

handshake = [
    dict(name='hello_direct', hex=msg(1, 1, 1).hex(), valid=True, type=1, version=1, arg=1),
    dict(name='hello_carrier', hex=msg(1, 1, 2).hex(), valid=True, type=1, version=1, arg=2),
    dict(name='welcome', hex=msg(2, 1, 0).hex(), valid=True, type=2, version=1, arg=0),
    dict(name='reject_bad_version', hex=msg(3, 1, 2).hex(), valid=True, type=3, version=1, arg=2),
    dict(name='reject_need_carrier', hex=msg(3, 1, 4).hex(), valid=True, type=3, version=1, arg=4),
    dict(name='reject_not_served', hex=msg(3, 1, 7).hex(), valid=True, type=3, version=1, arg=7),
    dict(name='hello_recycle', hex=msg(1, 1, 1, flags=1, ticket=0x01020304).hex(), valid=True,
         type=1, version=1, arg=1, flags=1, ticket=0x01020304),
    dict(name='hello_unknown_flags_ignored', hex=msg(1, 1, 1, flags=0x80000000).hex(), valid=True,
         type=1, version=1, arg=1),
    dict(name='bad_magic', hex=(b'XOLO' + msg(1, 1, 1)[4:]).hex(), valid=False),
    dict(name='short', hex=msg(1, 1, 1)[:15].hex(), valid=False),
    dict(name='long', hex=(msg(1, 1, 1) + b'\0').hex(), valid=False),
    dict(name='unknown_type', hex=msg(9, 1, 1).hex(), valid=False),
    dict(name='hello_bad_mode', hex=msg(1, 1, 7).hex(), valid=False),
]
write('handshake.json', handshake)

layouts = [layout(4096, 0, 0), layout(262144, 65536, 16), layout(1 << 20, 1 << 20, 8),
           layout(65536, 64, 65536), layout(8192, 192, 3)]
write('layout.json', layouts)

lay = layouts[1]
hdr = bytearray(1024)
struct.pack_into('<8sIIQIIIIII', hdr, 0, b'COLOSEG\0', 1, 1024, lay['segment_size'],
                 lay['ring_capacity'], lay['slot_size'], lay['slot_count'], 0, 4242, 4343)
hdr[48:72] = addr(4, '127.0.0.1', 0)
hdr[72:96] = addr(4, '127.0.0.1', 7000)
write('header.json', [
    dict(name='direct_v4', ring_capacity=lay['ring_capacity'], slot_size=lay['slot_size'],
         slot_count=lay['slot_count'], claim=0, client_pid=4242, server_pid=4343,
         client_addr='127.0.0.1:0', server_addr='127.0.0.1:7000', segment_size=lay['segment_size'],
         hex=bytes(hdr[:128]).hex()),
])
hdr6 = bytearray(hdr[:128])
struct.pack_into('<I', hdr6, 36, 1)
hdr6[48:72] = addr(6, '::1', 40000)
hdr6[72:96] = addr(6, '::1', 8080)
with open(os.path.join(HERE, 'header.json')) as f:
    h = json.load(f)
h.append(dict(name='carrier_v6', ring_capacity=lay['ring_capacity'], slot_size=lay['slot_size'],
              slot_count=lay['slot_count'], claim=1, client_pid=4242, server_pid=4343,
              client_addr='[::1]:40000', server_addr='[::1]:8080', segment_size=lay['segment_size'],
              hex=bytes(hdr6).hex()))
write('header.json', h)

# Invalid headers: (name, field offset, u32 value) patched into direct_v4.
bad = []
for name, off, val in [('bad_version', 8, 2), ('bad_header_size', 12, 8192),
                       ('capacity_not_pow2', 24, 12288), ('capacity_too_small', 24, 2048),
                       ('slot_size_not_multiple_of_64', 28, 100), ('slots_without_size', 28, 0),
                       ('too_many_slots', 32, 65537), ('bad_claim', 36, 7)]:
    b = bytearray(hdr[:128]); struct.pack_into('<I', b, off, val)
    bad.append(dict(name=name, hex=bytes(b).hex()))
b = bytearray(hdr[:128]); b[0] = ord('X'); bad.append(dict(name='bad_magic', hex=bytes(b).hex()))
b = bytearray(hdr[:128]); struct.pack_into('<Q', b, 16, lay['segment_size'] + 4096)
bad.append(dict(name='size_mismatch', hex=bytes(b).hex()))
write('header_invalid.json', bad)

rings = []
for cap, head, tail in [(4096, 0, 0), (4096, 100, 0), (4096, 4096, 0), (4096, 4097, 0),
                        (4096, 5, 10), (4096, 2**64 - 10, 2**64 - 20), (4096, 10, 2**64 - 20),
                        (4096, 4086, 2**64 - 11), (65536, 70000, 5000)]:
    used = (head - tail) % 2**64
    ok = used <= cap
    rings.append(dict(capacity=cap, head=str(head), tail=str(tail), valid=ok,
                      readable=used if ok else None, writable=cap - used if ok else None,
                      read_at=(tail % cap) if ok else None))
write('ring.json', rings)

names = [('127.0.0.1:7000', 'colo/1/127.0.0.1:7000', ['colo/1/127.0.0.1:7000', 'colo/1/0.0.0.0:7000', 'colo/1/[::]:7000']),
         ('127.0.0.2:80', 'colo/1/127.0.0.2:80', ['colo/1/127.0.0.2:80', 'colo/1/0.0.0.0:80', 'colo/1/[::]:80']),
         ('0.0.0.0:6379', 'colo/1/0.0.0.0:6379', None),
         ('[::1]:8080', 'colo/1/[::1]:8080', ['colo/1/[::1]:8080', 'colo/1/[::]:8080']),
         ('[::ffff:127.0.0.1]:9000', 'colo/1/127.0.0.1:9000', ['colo/1/127.0.0.1:9000', 'colo/1/0.0.0.0:9000', 'colo/1/[::]:9000']),
         ('[::]:443', 'colo/1/[::]:443', None),
         ('[2001:db8:0:0:0:0:0:1]:1', 'colo/1/[2001:db8::1]:1', None)]
write('names.json', [dict(addr=a, name=n, lookup=l) for a, n, l in names])

# Section 11: the cross-namespace messages on the TCP stream, and the NETNS HELLO.
NS_MAGIC = b'\0COLO-NS'
boot = bytes(range(16))
def ns_answer(kind, reason, nonce, name):
    return NS_MAGIC + bytes([kind, 1, reason, len(name)]) + bytes(4) + boot + nonce + name.ljust(64, b'\0')
netns = [
    dict(name='proposal', hex=(NS_MAGIC + bytes([1, 1]) + bytes(6) + boot + bytes(range(0x10, 0x18))).hex(),
         boot=boot.hex(), client_nonce=bytes(range(0x10, 0x18)).hex()),
    dict(name='accept', hex=ns_answer(2, 0, bytes(range(0x20, 0x30)), b'colo-42-6379').hex(),
         boot=boot.hex(), server_nonce=bytes(range(0x20, 0x30)).hex(), rendezvous='colo-42-6379'),
    dict(name='decline_other_boot', hex=ns_answer(3, 2, bytes(16), b'').hex(), boot=boot.hex(), reason=2),
    dict(name='hello_carrier_netns', hex=msg(1, 1, 2, flags=2).hex(), proof_offset=104, proof_len=24),
]
write('netns.json', netns)
