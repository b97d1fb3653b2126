/* An inetd-style server: accepts on 127.0.0.1:PORT, and for each connection forks a child that
 * makes the connection its standard input and output (dup2 onto 0 and 1) and execs FILTER
 * (argv[3..]); the parent closes its copy and accepts the next. Prints "READY" once listening.
 * Ends after COUNT connections, waiting for their children. With IGNORE_CHLD=1 in the
 * environment it ignores SIGCHLD instead (the kernel reaps; its children exec with it ignored). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: inetd PORT COUNT FILTER [ARG...]\n"); return 2; }
    alarm(120);
    if (getenv("IGNORE_CHLD")) signal(SIGCHLD, SIG_IGN);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 16)) { perror("listen"); return 1; }
    printf("READY\n");
    fflush(stdout);
    for (int n = atoi(argv[2]); n > 0; n--) {
        int c = accept(l, NULL, NULL);
        if (c < 0) { perror("accept"); return 1; }
        pid_t p = fork();
        if (p == 0) {
            close(l);
            if (dup2(c, 0) < 0 || dup2(c, 1) < 0) _exit(126);
            close(c);
            /* EXEC_DELAY_MS: the client may be gone before the exec (tests/apps/stdio_exec.sh). */
            if (getenv("EXEC_DELAY_MS")) usleep(1000 * atoi(getenv("EXEC_DELAY_MS")));
            execvp(argv[3], argv + 3);
            _exit(127);
        }
        close(c);
    }
    while (wait(NULL) > 0) {}
    return 0;
}
