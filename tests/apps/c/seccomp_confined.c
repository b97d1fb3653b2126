/* A process that confines itself with a seccomp filter while it holds an accelerated connection
 * (OpenSSH's pre-authentication child: sandboxed to read, write, poll and a few more, anything
 * else kills it). Over TCP it goes on reading and writing its connection; the shim's calls for
 * the connection (a doorbell's sendto and recvmsg, a thread a sleeper starts) are not among
 * those allowed, and the filter killed the child at its first exchange (SIGSYS). Here a forked
 * child confines itself, then echoes 2 MiB in chunks with its peer (a sleep on each side
 * included), as the parent keeps its copy of the connection (sshd's monitor) and uses it after
 * the child exits. A second connection made after the filter (by the parent, unconfined) is
 * accelerated as before. alarm() is the watchdog. */
#define _GNU_SOURCE
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "scenario.h"

#define BYTES (2 * 1024 * 1024)
#define CHUNK 4096

#define ALLOW(nr) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)

/* The calls OpenSSH's pre-authentication sandbox allows (most of them); anything else kills. */
static void confine(void) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        ALLOW(SYS_read), ALLOW(SYS_write), ALLOW(SYS_readv), ALLOW(SYS_writev), ALLOW(SYS_close),
        ALLOW(SYS_exit), ALLOW(SYS_exit_group), ALLOW(SYS_poll), ALLOW(SYS_ppoll), ALLOW(SYS_select),
        ALLOW(SYS_pselect6), ALLOW(SYS_futex), ALLOW(SYS_clock_gettime), ALLOW(SYS_gettimeofday),
        ALLOW(SYS_nanosleep), ALLOW(SYS_clock_nanosleep), ALLOW(SYS_brk), ALLOW(SYS_mmap),
        ALLOW(SYS_munmap), ALLOW(SYS_mprotect), ALLOW(SYS_madvise), ALLOW(SYS_rt_sigprocmask),
        ALLOW(SYS_rt_sigreturn), ALLOW(SYS_getpid), ALLOW(SYS_getrandom), ALLOW(SYS_shutdown),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) _exit(5);
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) _exit(6);
}

int main(void) {
    alarm(60);
    int k, c;
    connected_pair(&k, &c, 0);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        close(k);
        confine();
        static unsigned char buf[CHUNK];
        for (long got = 0; got < BYTES;) {
            if (got == BYTES / 2) usleep(100000); /* the peer waits on the child */
            ssize_t n = read(c, buf, sizeof buf);
            if (n <= 0) _exit(2);
            for (ssize_t w = 0; w < n;) {
                ssize_t m = write(c, buf + w, n - w);
                if (m <= 0) _exit(3);
                w += m;
            }
            got += n;
        }
        _exit(0);
    }
    static unsigned char out[CHUNK], back[CHUNK];
    long bad = -1;
    for (long sent = 0; sent < BYTES; sent += CHUNK) {
        if (sent == BYTES / 4) usleep(100000); /* the child waits on its peer */
        for (int i = 0; i < CHUNK; i++) out[i] = pattern(sent + i);
        write_all(k, out, CHUNK);
        if (read_full(k, back, CHUNK) != 0) { bad = sent; break; }
        if (bad < 0 && memcmp(out, back, CHUNK) != 0) bad = sent;
    }
    CHECK(bad < 0, "the confined child echoed every byte, in order");
    int st;
    CHECK(waitpid(pid, &st, 0) == pid, "the child ended");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "... on its own (not killed by its filter)");
    /* The parent's copy (sshd's monitor hands it to the next child) carries on. */
    write_all(c, "after", 5);
    char b[5];
    CHECK(read_full(k, b, 5) == 0 && memcmp(b, "after", 5) == 0, "the parent's copy of the connection works after the child");
    close(c);
    close(k);
    connected_pair(&k, &c, 0);
    if (shimmed()) CHECK(segments() >= 2, "a connection made after (in the unconfined parent) is accelerated");
    close(k);
    close(c);
    if (failures == 0) printf("seccomp_confined: ok\n");
    return failures != 0;
}
