/* The exit wrapper in C: the same contract as exit_wrapper.py, without starting a Python interpreter.
 *
 * exit-wrapper EXIT_FILE COMMAND [ARG...]
 *
 * The process runtime starts every attempt through it (as the leader of the attempt's process group)
 * when `make native` could build it (gpuquota.node_agent.native_wrapper), else through exit_wrapper.py.
 * It writes its pid to EXIT_FILE.pid, runs COMMAND as its child (same group, working directory,
 * environment and output; SIGPIPE and SIGXFSZ at their defaults), waits for it, and writes
 * {"exit_code": N} or {"signal": N} to EXIT_FILE (atomically: EXIT_FILE.tmp renamed), then ends the
 * same way as the command (it raises the signal again), so an agent that is still its parent sees the
 * usual exit status. A command that cannot be started is recorded as
 * {"exit_code": 127, "error": "..."} and the wrapper exits with 127. A restarted agent, which is not
 * the parent any more, reads EXIT_FILE (gpuquota.node_agent.runtime.read_exit).
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

/* `path` followed by `suffix` (the caller frees it), or NULL when out of memory. */
static char *with_suffix(const char *path, const char *suffix) {
    size_t size = strlen(path) + strlen(suffix) + 1;
    char *name = malloc(size);
    if (name != NULL) snprintf(name, size, "%s%s", path, suffix);
    return name;
}

/* Writes `text` to `path` (created or truncated): 0 when all of it was written and the file closed. */
static int write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return -1;
    int failed = write_all(fd, text, strlen(text));
    failed |= close(fd);
    return failed;
}

/* Writes `text` to `path` whole or not at all: a reader never sees half a record. */
static void write_atomically(const char *path, const char *text) {
    char *tmp = with_suffix(path, ".tmp");
    if (tmp == NULL) return;
    if (write_file(tmp, text) == 0) rename(tmp, path);
    free(tmp);
}

/* EXIT_FILE.pid: the wrapper's pid, for an agent that restarts while the command runs. */
static void write_pid_file(const char *exit_path) {
    char *path = with_suffix(exit_path, ".pid");
    if (path == NULL) return;
    char text[32];
    snprintf(text, sizeof text, "%ld", (long)getpid());
    write_file(path, text);
    free(path);
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
    write_atomically(exit_path, doc);
}

static void write_outcome(const char *exit_path, const char *key, int value) {
    char doc[64];
    snprintf(doc, sizeof doc, "{\"%s\": %d}", key, value);
    write_atomically(exit_path, doc);
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
    write_pid_file(exit_path);

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
