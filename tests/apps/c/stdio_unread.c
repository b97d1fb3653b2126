/* An inetd-style server whose exec'd child reads part of the connection: the parent holds an
 * accepted connection, forks, and the child makes the connection its standard input (and
 * output) and execs a program that reads some of it; the parent waits for the child, then reads
 * on. The client sent 5 + N bytes and shut down writing. Over TCP the bytes the program never
 * read stay in the socket for the parent, which reads exactly those, byte for byte, then end of
 * stream. Under colo the program's standard input is relayed (a relay process hands the peer's
 * bytes to a loopback socket), and the bytes it handed on that the program never read must not
 * die with the program's end. Children: `head -c 5` (reads 5, echoes them), `true` (reads
 * nothing), `cat` to /dev/null (reads everything: the parent reads end of stream at once).
 * And a child that only writes (its standard input /dev/null) while the parent reads the
 * peer's bytes beside it: the parent gets them all (the relay hands them to the program's end,
 * which never reads them, and must leave them in the ring). Each case accepted plainly and
 * close-on-exec (the connection then becomes inheritable by the child's dup2), all
 * accelerated (COLO_SHORT_LIVED=accelerate), with rings of 128 KiB (COLO_RING_KB=128: smaller
 * than the loopback's buffers, so the relay also waits with everything the ring holds handed
 * on and the peer's writer waiting for space). A program that reads in two bursts with a pause
 * between (two `head`s in a shell) while a writer process sends BIG bytes: the parent reads the
 * rest exactly. Last, a program that closes its standard input and
 * output and lives on, its parent's copy closed: the client reads end of stream while the
 * program lives, as over TCP (the relay, which keeps a copy of the program's end, must notice
 * the close). alarm() is the watchdog. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

#include "scenario.h"

#define N 100000
#define BIG 3000000
#define BURSTS 1000000
#define REPEAT 2

enum child { HEAD, TRUE, CAT, WRITER, TWO_BURSTS, CLOSER, CHILDREN };
static const char *const names[CHILDREN] = {"head -c 5", "true", "cat >/dev/null", "a writer only", "two bursts", "a closer"};

/* The exec'd writer: "R" (the parent's cue that its relay runs), then, once the parent has
 * read the peer's bytes beside it, 999 more bytes; its standard input is /dev/null. */
static int writer(void) {
    char b[999];
    memset(b, 'w', sizeof b);
    write_all(1, "R", 1);
    usleep(300000);
    write_all(1, b, sizeof b);
    return 0;
}

/* The exec'd closer: closes its standard input and output, then lives until killed. */
static int closer(void) {
    close(0);
    close(1);
    sleep(60);
    return 0;
}

static void child(enum child which, int c) {
    int null = open("/dev/null", O_RDWR);
    if (null < 0) _exit(125);
    if (dup2(which == WRITER ? null : c, 0) < 0 || dup2(which == CAT || which == TWO_BURSTS ? null : c, 1) < 0) _exit(126);
    close(c);
    close(null);
    switch (which) {
    case HEAD: execlp("head", "head", "-c", "5", (char *)NULL); break;
    case TRUE: execlp("true", "true", (char *)NULL); break;
    case CAT: execlp("cat", "cat", (char *)NULL); break;
    case WRITER: execl("/proc/self/exe", "stdio_unread", "writer", (char *)NULL); break;
    case TWO_BURSTS:
        execl("/bin/sh", "sh", "-c", "head -c 300000 >/dev/null; sleep 0.2; head -c 700000 >/dev/null", (char *)NULL);
        break;
    default: execl("/proc/self/exe", "stdio_unread", "closer", (char *)NULL); break;
    }
    _exit(127);
}

/* The bytes the client sends: "HELLO", then `len` of the pattern. */
static void send_request(int k, long len) {
    static unsigned char b[BIG];
    for (long i = 0; i < len; i++) b[i] = pattern(i);
    write_all(k, "HELLO", 5);
    write_all(k, b, len);
    if (shutdown(k, SHUT_WR) < 0) die("shutdown");
}

/* Reads `c` to end of stream; whether it was exactly the request of `len` from byte `from` on:
 * "HELLO" and the pattern (from = 5: the pattern only). */
static int rest_is(int c, long len, long from, long *got) {
    static unsigned char b[BIG + 4096];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof b && (r = read(c, b + n, sizeof b - n)) != 0) {
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) break;
        n += r;
    }
    *got = n;
    if ((long)n != len + 5 - from) return 0;
    for (long i = from; i < len + 5; i++) {
        unsigned char want = i < 5 ? "HELLO"[i] : pattern(i - 5);
        if (b[i - from] != want) {
            fprintf(stderr, "byte %ld: %u, %u expected\n", i, b[i - from], want);
            return 0;
        }
    }
    return 1;
}

static int round_of(int l, struct sockaddr_in *a, enum child which, int flags) {
    int ok = 1;
    int k = socket(AF_INET, SOCK_STREAM, 0);
    if (k < 0 || connect(k, (struct sockaddr *)a, sizeof *a) < 0) die("connect");
    int c = accept4(l, NULL, NULL, flags);
    if (c < 0) die("accept");
    /* One byte first, so that the connection is in use (under the shim: accelerated at both
     * ends) before the fork. */
    char q;
    write_all(k, "q", 1);
    CHECK(read(c, &q, 1) == 1 && q == 'q', "the first byte");
    if (which != WRITER && which != CLOSER && which != TWO_BURSTS) send_request(k, N);
    /* BIG bytes wait for the program's reads: a process of their own writes them. */
    pid_t sender = which == TWO_BURSTS ? fork() : 1;
    if (sender < 0) die("fork");
    if (sender == 0) {
        close(c);
        close(l);
        send_request(k, BIG);
        _exit(0);
    }
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        close(k);
        close(l);
        child(which, c);
    }
    long got = 0;
    if (which == CLOSER) {
        close(c);
        char b[16];
        ssize_t r;
        while ((r = read(k, b, sizeof b)) < 0 && errno == EINTR) {}
        CHECK(r == 0, "the client reads end of stream while the program that closed its end lives");
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(k);
        return r == 0;
    }
    if (which == WRITER) {
        /* The request goes out once the program runs (its relay with it), and the parent reads
         * it while the program lives. */
        CHECK(read(k, &q, 1) == 1 && q == 'R', "the writer's cue");
        send_request(k, N);
        ok &= rest_is(c, N, 0, &got);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child exits 0");
    if (which == TWO_BURSTS) {
        ok &= rest_is(c, BIG, BURSTS, &got);
        CHECK(waitpid(sender, &st, 0) == sender && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the writer sent every byte");
    } else if (which != WRITER) {
        ok &= rest_is(c, N, which == HEAD ? 5 : which == TRUE ? 0 : N + 5, &got);
    }
    if (!ok) fprintf(stderr, "%s, accepted %s: the parent read %ld bytes\n", names[which], flags ? "close-on-exec" : "plainly", got);
    write_all(c, "DONE\n", 5);
    close(c);
    /* What the client reads: the program's output, then the parent's "DONE". */
    char b[2048];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof b && (r = read(k, b + n, sizeof b - n)) > 0) n += r;
    const char *want = which == HEAD ? "HELLODONE\n" : "DONE\n";
    if (which == WRITER) {
        int w = n == 1004 && memcmp(b + 999, "DONE\n", 5) == 0;
        for (int i = 0; w && i < 999; i++) w = b[i] == 'w';
        CHECK(w, "the client reads the writer's bytes, then DONE");
    } else {
        CHECK(n == strlen(want) && memcmp(b, want, n) == 0, "the client reads what the program echoed, then DONE");
    }
    close(k);
    return ok;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "writer") == 0) return writer();
    if (argc == 2 && strcmp(argv[1], "closer") == 0) return closer();
    /* Every round accelerated: a run of short connections would otherwise go plain TCP. */
    if (shimmed() && !getenv("COLO_SHORT_LIVED")) {
        setenv("COLO_SHORT_LIVED", "accelerate", 1);
        setenv("COLO_RING_KB", "128", 1);
        execv("/proc/self/exe", argv);
        die("execv");
    }
    alarm(60);
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 4);
    int intact = 0, rounds = 0;
    for (int which = 0; which < CHILDREN; which++)
        for (int rep = 0; rep < 2 * REPEAT; rep++, rounds++)
            intact += round_of(l, &a, which, rep % 2 ? SOCK_CLOEXEC : 0);
    close(l);
    fprintf(stderr, "%d of %d rounds: the parent read exactly what the program left\n", intact, rounds);
    CHECK(intact == rounds, "the parent reads what the program left unread");
    if (failures) return 1;
    printf("stdio_unread: ok\n");
    return 0;
}
