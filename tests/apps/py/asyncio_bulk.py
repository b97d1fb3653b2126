"""Bulk transfer through stdlib asyncio streams, one connection: `server` prints its port and
serves until killed; `client PORT up|down CHUNK MB` sends (up) or receives (down) MB mebibytes in
writes of CHUNK bytes (each awaited with drain), checks the count the other end saw, and prints
MB/s."""
import asyncio
import sys
import time


async def count_to_end(r):
    """Reads `r` to its end; returns how many bytes came."""
    got = 0
    while True:
        b = await r.read(262144)
        if not b:
            return got
        got += len(b)


async def serve(r, w):
    mode = (await r.readline()).split()
    if mode[0] == b"up":
        w.write(b"%d\n" % await count_to_end(r))
    else:
        chunk, total = int(mode[1]), int(mode[2])
        buf = b"x" * chunk
        for _ in range(total // chunk):
            w.write(buf)
            await w.drain()
    await w.drain()
    w.close()


async def server():
    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    print(srv.sockets[0].getsockname()[1], flush=True)
    await srv.serve_forever()


async def client(port, mode, chunk, total):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    start = time.perf_counter()
    if mode == "up":
        w.write(b"up\n")
        buf = b"x" * chunk
        for _ in range(total // chunk):
            w.write(buf)
            await w.drain()
        w.write_eof()
        got = int(await r.readline())
    else:
        w.write(b"down %d %d\n" % (chunk, total))
        got = await count_to_end(r)
    took = time.perf_counter() - start
    w.close()
    if got != total // chunk * chunk:
        sys.exit(f"{got} bytes arrived of {total // chunk * chunk}")
    print(f"{got / took / 1e6:.0f}")


if sys.argv[1] == "server":
    asyncio.run(server())
else:
    asyncio.run(client(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]) << 20))
