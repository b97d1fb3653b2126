/* A program that points `stdout` at a stream of its own (a log file: glibc documents the three
 * standard streams as variables a program may assign), then dup2s a connection onto descriptor
 * 1 and writes to it with write(2) (run with the shim preloaded, as tests/apps/run.sh does; also
 * passes without it). Its printf output belongs to the log, as with plain kernel TCP: the shim's
 * swap of stdout for a connection landing on 1 must leave a stream that is not descriptor 1's
 * alone. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <sys/wait.h>

#include "scenario.h"

int main(void) {
    alarm(30);
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in a;
    int l = loopback_listener(&a, 1);
    fflush(NULL);
    pid_t cl = fork();
    if (cl == 0) {
        close(l);
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        char buf[64];
        CHECK(read_full(c, buf, 7) == 0 && memcmp(buf, "direct\n", 7) == 0, "the bytes written to descriptor 1");
        CHECK(read(c, buf, 1) == 0, "nothing else: printf's output went to the log");
        exit(failures != 0);
    }
    int c = accept(l, NULL, NULL);
    if (c < 0) die("accept");
    FILE *log = tmpfile();
    if (!log) die("tmpfile");
    int real_out = dup(1);
    stdout = log;
    if (dup2(c, 1) < 0) die("dup2");
    close(c);
    printf("to the log\n");
    fflush(stdout);
    write_all(1, "direct\n", 7);
    close(1);
    dup2(real_out, 1);
    char got[64] = {0};
    rewind(log);
    size_t n = fread(got, 1, sizeof got - 1, log);
    CHECK(n == 11 && memcmp(got, "to the log\n", 11) == 0, "printf wrote to the program's own stream");
    CHECK(stdout == log, "stdout is still the program's stream");
    int st;
    CHECK(waitpid(cl, &st, 0) == cl && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the client's checks passed");
    return failures != 0;
}
