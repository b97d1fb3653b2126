/* Root's victim for t_rt_peer_memfd_name.sh. `inetd_peername PORT`: a classic inetd-style server
   (tcpserver, inetd "nowait"): plain accept(2) (the connection inheritable), fork, the
   connection on descriptors 0 and 1, exec of itself as the handler. The handler authorizes by
   the peer's address, as tcpd (tcp wrappers), `sshd -i` with `from=` or rsyncd's `hosts allow`
   do: only 10.9.9.9, the "admin host", is told the secret; every handler logs what getpeername
   answered on standard error. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <sys/resource.h>
static int handler(void) {
    struct sockaddr_in p; socklen_t n = sizeof p; char ip[64] = "?", out[256];
    if (getpeername(0, (void *)&p, &n) == 0) inet_ntop(AF_INET, &p.sin_addr, ip, sizeof ip);
    struct rlimit r; getrlimit(RLIMIT_NOFILE, &r);
    fprintf(stderr, "HANDLER getpeername(0) = %s:%d\n", ip, ntohs(p.sin_port));
    fprintf(stderr, "HANDLER getrlimit(NOFILE) = soft %lu hard %lu\n", (unsigned long)r.rlim_cur, (unsigned long)r.rlim_max);
    if (strcmp(ip, "10.9.9.9") == 0) snprintf(out, sizeof out, "hello %s: the secret is ROOT-ONLY-SECRET\n", ip);
    else snprintf(out, sizeof out, "hello %s: denied\n", ip);
    return write(1, out, strlen(out)) < 0;
}
int main(int argc, char **argv) {
    if (argc < 2) return handler();
    signal(SIGCHLD, SIG_IGN);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1])), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(l, (void *)&a, sizeof a) || listen(l, 16)) { perror("listen"); return 1; }
    for (;;) {
        int c = accept(l, NULL, NULL);
        if (c < 0) continue;
        if (fork() == 0) {
            close(l);
            dup2(c, 0); dup2(c, 1);
            if (c > 1) close(c);
            execl("/proc/self/exe", argv[0], (char *)0);
            _exit(127);
        }
        close(c);
    }
}
