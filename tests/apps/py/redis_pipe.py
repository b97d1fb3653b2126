"""Writes N SET commands in redis's protocol (RESP) to standard output, for `redis-cli --pipe`:
key k:NNNNNN (six digits) to value vNNNNNNNNN (nine digits), i from 0 to N-1."""
import sys

n = int(sys.argv[1])
out = bytearray()
for i in range(n):
    k, v = b"k:%06d" % i, b"v%09d" % i
    out += b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v)
sys.stdout.buffer.write(out)
