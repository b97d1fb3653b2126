// An HTTP server on Node's event loop (libuv: epoll, accept4, closes by syscall(SYS_close)):
// a 1 KiB reply per request; GET /count answers how many other requests it has served.
const http = require('http');
const body = 'x'.repeat(1024);
let served = 0;
http.createServer((req, res) => {
  if (req.url === '/count') return res.end(String(served));
  served++;
  res.end(body);
}).listen(+process.argv[2], '127.0.0.1', () => console.log('READY', process.pid));
