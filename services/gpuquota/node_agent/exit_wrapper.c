/* The exit wrapper in C: the same contract as exit_wrapper.py, without starting a Python interpreter.
 *
 * exit-wrapper EXIT_FILE COMMAND [ARG...]
 *
 * The process runtime starts every attempt through it (as the leader of the attempt's process group)
 * when `make native` could build it (gpuquota.node_agent.native_wrapper), else through exit_wrapper.py.
 * It writes {"pid": N} (its own pid, for an agent that restarts while the command runs) to EXIT_FILE,
 * runs COMMAND as its child (same group, working directory, environment and output; SIGPIPE and
 * SIGXFSZ at their defaults), waits for it, and then replaces that record with {"exit_code": N} or
 * {"signal": N}, in place: one write at offset 0, padded with spaces to at least the pid record's
 * length, so a reader finds one whole record or the other, never a mix. It then ends the same way as
 * the command (it raises the signal again), so an agent that is still its parent sees the usual exit
 * status. A command that cannot be started is recorded as {"exit_code": 127, "error": "..."} and the
 * wrapper exits with 127. A restarted agent, which is not the parent any more, reads EXIT_FILE
 * (gpuquota.node_agent.runtime.read_exit and wrapper_pid).
 *
 * One file, not a pid file beside an exit file renamed into place: each new file costs the node an
 * inode, which on ext4 without a journal is a scan of the recently freed ones (docs/benchmarks.md).
 *
 * SIGTERM, SIGINT and SIGHUP reach the whole group; the wrapper only waits for the command to react
 * (it catches them with a handler that does nothing; exec gives the command the defaults back).
 *
 * Why C: a node starting a hundred short attempts a second paid about 3 ms of CPU per attempt for the
 * Python interpreter's start-up alone; this costs a fork and an exec.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static const int forwarded[] = {SIGTERM, SIGINT, SIGHUP};
#define FORWARDED_COUNT (sizeof forwarded / sizeof forwarded[0])

static void ignore_but_interrupt(int sig) { (void)sig; }

static int write_all(int fd, const char *text, size_t length) {
    while (length > 0) {
        ssize_t written = write(fd, text, length);
        if (written < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        text += written;
        length -= (size_t)written;
    }
    return 0;
}

/* EXIT_FILE, open from the start to the outcome (-1: it could not be made), and the length of the
 * pid record written first, which the outcome covers whole. */
static int record_fd = -1;
static size_t pid_record_length = 0;

/* {"pid": N} in EXIT_FILE (created or truncated): the wrapper's pid, for an agent that restarts
 * while the command runs. */
static void write_pid_record(const char *exit_path) {
    record_fd = open(exit_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (record_fd < 0) return;
    char text[48];
    snprintf(text, sizeof text, "{\"pid\": %ld}", (long)getpid());
    if (write_all(record_fd, text, strlen(text)) == 0) pid_record_length = strlen(text);
}

/* Replaces the pid record with `text` in one write at offset 0, padded with spaces (JSON allows them)
 * to cover the pid record: a reader sees one whole record or the other. Without the file open (it
 * could not be made at the start), the record is written whole to a new one. */
static void write_record(const char *exit_path, const char *text) {
    size_t length = strlen(text);
    size_t padded = length < pid_record_length ? pid_record_length : length;
    char *doc = malloc(padded);
    if (doc == NULL) return;
    memcpy(doc, text, length);
    memset(doc + length, ' ', padded - length);
    if (record_fd < 0) record_fd = open(exit_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (record_fd >= 0) {
        while (pwrite(record_fd, doc, padded, 0) < 0 && errno == EINTR) {
        }
        close(record_fd);
        record_fd = -1;
    }
    free(doc);
}

/* Appends `text` to `out` as the inside of a JSON string (out has room for 6 bytes per byte). */
static char *json_escape(char *out, const char *text) {
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        if (*c == '"' || *c == '\\') {
            *out++ = '\\';
            *out++ = (char)*c;
        } else if (*c < 0x20) {
            out += sprintf(out, "\\u%04x", *c);
        } else {
            *out++ = (char)*c;
        }
    }
    return out;
}

/* {"exit_code": 127, "error": "[Errno 2] No such file or directory: 'cmd'"}: Python's OSError text. */
static void write_spawn_error(const char *exit_path, int error, const char *command) {
    char reason[256];
    snprintf(reason, sizeof reason, "[Errno %d] %s: '%s'", error, strerror(error), command);
    char doc[sizeof reason * 6 + 64];
    char *end = doc + sprintf(doc, "{\"exit_code\": 127, \"error\": \"");
    end = json_escape(end, reason);
    strcpy(end, "\"}");
    write_record(exit_path, doc);
}

static void write_outcome(const char *exit_path, const char *key, int value) {
    char doc[64];
    snprintf(doc, sizeof doc, "{\"%s\": %d}", key, value);
    write_record(exit_path, doc);
}

/* Ends the way the command ended: by the same signal (its default action), or by its exit code. */
static int end_like(int sig) {
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core); /* the command dumped its core, if any: not the wrapper's too */
    signal(sig, SIG_DFL);
    kill(getpid(), sig);
    return 128 + sig; /* the signal is blocked: end with the shell's convention */
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: exit-wrapper EXIT_FILE COMMAND [ARG...]\n");
        return 2;
    }
    const char *exit_path = argv[1];
    char **command = argv + 2;

    struct sigaction handler;
    memset(&handler, 0, sizeof handler);
    handler.sa_handler = ignore_but_interrupt; /* a handler, not SIG_IGN: the command gets defaults */
    sigemptyset(&handler.sa_mask);
    for (size_t i = 0; i < FORWARDED_COUNT; i++) sigaction(forwarded[i], &handler, NULL);
    write_pid_record(exit_path);

    /* the agent's Python ignores SIGPIPE and SIGXFSZ; the command gets them back at their defaults */
    signal(SIGPIPE, SIG_DFL);
    signal(SIGXFSZ, SIG_DFL);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    sigset_t defaults;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGPIPE);
    sigaddset(&defaults, SIGXFSZ);
    posix_spawnattr_setsigdefault(&attributes, &defaults);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGDEF);
    pid_t child;
    /* glibc's posix_spawnp uses vfork and reports a failed exec here */
    int error = posix_spawnp(&child, command[0], NULL, &attributes, command, environ);
    posix_spawnattr_destroy(&attributes);
    if (error != 0) {
        write_spawn_error(exit_path, error, command[0]);
        return 127;
    }

    int status;
    while (waitpid(child, &status, 0) < 0) {
        if (errno != EINTR) { /* cannot happen for our own child; say so rather than guess */
            write_spawn_error(exit_path, errno, command[0]);
            return 127;
        }
    }
    if (WIFSIGNALED(status)) {
        write_outcome(exit_path, "signal", WTERMSIG(status));
        return end_like(WTERMSIG(status));
    }
    write_outcome(exit_path, "exit_code", WEXITSTATUS(status));
    return WEXITSTATUS(status);
}
