"""An HTTP/1.1 keep-alive server on Python's asyncio event loop (epoll, close(2)): a 1 KiB reply
per request; GET /count answers how many other requests it has served."""
import asyncio, os, sys

BODY = b"x" * 1024
served = 0


async def handle(reader, writer):
    global served
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if head.startswith(b"GET /count "):
                body = str(served).encode()
            else:
                served += 1
                body = BODY
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    print("READY", os.getpid(), flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
