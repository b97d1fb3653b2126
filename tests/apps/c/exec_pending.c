/* A connection dialed and handed to a new program image before its first use (under the shim:
 * still waiting for the server's answer, "pending", at the exec): ucspi's tcpclient connects
 * and execs its program with the socket. Over TCP the new image simply uses the socket.
 *   1. a process connects, then execv()s this program, which writes and reads on the socket;
 *   2. a process connects, then posix_spawn()s this program with the socket, and closes its
 *      own copy;
 *   3. the same with vfork() and execv() in the child (CPython's subprocess).
 * The server is this program's first process (forked before the connects), which checks the
 * bytes both ways. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <spawn.h>
#include <sys/wait.h>

#include "scenario.h"

extern char **environ;

/* The new image: "hello" out, "olleh" back, on descriptor `fd`. */
static int image(int fd) {
    write_all(fd, "hello", 5);
    char b[5];
    if (read_full(fd, b, 5) != 0 || memcmp(b, "olleh", 5) != 0) {
        fprintf(stderr, "exec_pending image: the server's reply did not come\n");
        return 2;
    }
    return 0;
}

/* One connection of a client process that hands it to a new image as `how` says. */
static void client(const char *self, struct sockaddr_in *a, const char *how) {
    int k = socket(AF_INET, SOCK_STREAM, 0);
    if (k < 0 || connect(k, (struct sockaddr *)a, sizeof *a) < 0) _exit(8);
    usleep(100000); /* the server accepts meanwhile: its answer waits, unread */
    char fd[16];
    snprintf(fd, sizeof fd, "%d", k);
    char *av[] = {(char *)self, "image", fd, NULL};
    if (strcmp(how, "exec") == 0) {
        execv(self, av);
        _exit(9);
    }
    pid_t pid;
    if (strcmp(how, "vfork") == 0) {
        pid = vfork();
        if (pid == 0) {
            execv(self, av);
            _exit(12);
        }
        if (pid < 0) _exit(13);
    } else if (posix_spawn(&pid, self, NULL, NULL, av, environ) != 0) {
        _exit(10);
    }
    close(k);
    int st;
    _exit(waitpid(pid, &st, 0) == pid && WIFEXITED(st) ? WEXITSTATUS(st) : 11);
}

int main(int argc, char **argv) {
    alarm(20);
    if (argc > 2 && strcmp(argv[1], "image") == 0) return image(atoi(argv[2]));
    const char *hows[] = {"exec", "posix_spawn", "vfork"};
    for (int i = 0; i < 3; i++) {
        struct sockaddr_in a;
        int l = loopback_listener(&a, 4);
        pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) {
            close(l);
            client(argv[0], &a, hows[i]);
        }
        int c = accept(l, NULL, NULL);
        if (c < 0) die("accept");
        close(l);
        char b[5];
        char what[96];
        snprintf(what, sizeof what, "%s: the server reads what the new image wrote", hows[i]);
        CHECK(read_full(c, b, 5) == 0 && memcmp(b, "hello", 5) == 0, what);
        write_all(c, "olleh", 5);
        int st;
        snprintf(what, sizeof what, "%s: the new image reads the server's reply (exit 0)", hows[i]);
        CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, what);
        close(c);
    }
    if (failures) return 1;
    printf("exec_pending: ok\n");
    return 0;
}
