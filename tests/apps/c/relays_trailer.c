/* A server forks three children that each make the connection their standard output (dup2
 * onto 1) and exec `head -c 3000000 /dev/zero` side by side; it waits for all three, then writes
 * a trailer. Over TCP the trailer comes after every byte the programs wrote. Under colo each
 * program's output is relayed (the connection was accepted close-on-exec, so its dup2 relays it;
 * or, accepted inheritable, the exec hands it to a standard-I/O relay), and the relays must not
 * wait for each other's programs (they ran side by side) while the server's write waits for all
 * of them. The client counts the bytes and finds the trailer last. Both ways of accepting; alarm()
 * is the watchdog. */
#define _GNU_SOURCE
#include <sys/wait.h>

#include "scenario.h"

#define PROGRAMS 3
#define EACH 3000000L

static int one_round(int cloexec) {
    int c, s;
    connected_pair(&c, &s, cloexec ? SOCK_CLOEXEC : 0);
    /* One byte first: the connection is in use (accelerated at both ends) before the forks. */
    char q;
    write_all(c, "q", 1);
    if (read(s, &q, 1) != 1) die("first byte");
    /* The client reads in a process of its own, as the programs write. */
    pid_t reader = fork();
    if (reader < 0) die("fork");
    if (reader == 0) {
        close(s);
        static char got[PROGRAMS * EACH + 64];
        long n = 0;
        ssize_t r;
        while (n < (long)sizeof got && (r = read(c, got + n, sizeof got - n)) > 0) n += r;
        char *t = memmem(got, n, "TRAILER", 7);
        fprintf(stderr, "%s: %ld bytes, the trailer at %ld\n", cloexec ? "close-on-exec" : "inheritable", n, t ? (long)(t - got) : -1L);
        _exit(n == PROGRAMS * EACH + 7 && t == got + PROGRAMS * EACH ? 0 : 1);
    }
    close(c);
    pid_t ch[PROGRAMS];
    for (int i = 0; i < PROGRAMS; i++) {
        ch[i] = fork();
        if (ch[i] < 0) die("fork");
        if (ch[i] == 0) {
            if (dup2(s, 1) < 0) _exit(126);
            close(s);
            execlp("head", "head", "-c", "3000000", "/dev/zero", (char *)NULL);
            _exit(127);
        }
    }
    int ok = 1;
    for (int i = 0; i < PROGRAMS; i++) {
        int st;
        ok &= waitpid(ch[i], &st, 0) == ch[i] && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    CHECK(ok, "the programs exit 0");
    write_all(s, "TRAILER", 7);
    close(s);
    int st;
    return waitpid(reader, &st, 0) == reader && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(void) {
    alarm(60);
    signal(SIGPIPE, SIG_IGN);
    CHECK(one_round(1), "close-on-exec: every program's bytes, then the trailer");
    CHECK(one_round(0), "inheritable: every program's bytes, then the trailer");
    return failures != 0;
}
