/* posix_spawn as programs use it on a mount:
 *   spawn_on_mount open FILE [TEXT]
 *                              a program that already has a second thread
 *                              spawns cat with FILE opened on its stdin by
 *                              posix_spawn_file_actions_addopen (having
 *                              written TEXT to FILE itself first, if given);
 *   spawn_on_mount write FILE  spawns `echo spawned` with FILE opened on its
 *                              stdout (O_WRONLY|O_CREAT|O_TRUNC) by addopen;
 *   spawn_on_mount run PROG    spawns PROG (a path that may be on a mount)
 *                              with the argument "spawned".
 * Exits with the child's status, or 100 + errno when posix_spawn fails. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static int wake[2];

static void *idle(void *arg) {
    char c;
    (void)arg;
    /* Blocks until main is done: the spawn happens with two threads. */
    if (read(wake[0], &c, 1) < 0)
        perror("read");
    return NULL;
}

static int finish(int rc, pid_t pid, const char *what) {
    int status;
    if (rc != 0) {
        fprintf(stderr, "posix_spawn %s: %s\n", what, strerror(rc));
        return 100 + rc;
    }
    if (waitpid(pid, &status, 0) != pid) {
        perror("waitpid");
        return 99;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 98;
}

int main(int argc, char **argv) {
    pid_t pid;
    int rc;
    if (argc != 3 && !(argc == 4 && strcmp(argv[1], "open") == 0)) {
        fprintf(stderr, "usage: %s open FILE [TEXT] | write FILE | run PROG\n", argv[0]);
        return 2;
    }
    if (strcmp(argv[1], "write") == 0) {
        posix_spawn_file_actions_t fa;
        char *echo[] = {"echo", "spawned", NULL};
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        rc = posix_spawnp(&pid, "echo", &fa, NULL, echo, environ);
        return finish(rc, pid, argv[2]);
    }
    if (strcmp(argv[1], "open") == 0) {
        pthread_t t;
        posix_spawn_file_actions_t fa;
        char *cat[] = {"cat", NULL};
        if (argc == 4) {
            FILE *f = fopen(argv[2], "w");
            if (f == NULL || fputs(argv[3], f) < 0 || fclose(f) != 0) {
                perror(argv[2]);
                return 95;
            }
        }
        if (pipe(wake) != 0 || pthread_create(&t, NULL, idle, NULL) != 0) {
            perror("thread");
            return 97;
        }
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 0, argv[2], O_RDONLY, 0);
        rc = posix_spawnp(&pid, "cat", &fa, NULL, cat, environ);
        rc = finish(rc, pid, argv[2]);
        if (write(wake[1], "x", 1) != 1 || pthread_join(t, NULL) != 0)
            return 96;
        return rc;
    }
    char *args[] = {argv[2], "spawned", NULL};
    rc = posix_spawn(&pid, argv[2], NULL, NULL, args, environ);
    return finish(rc, pid, argv[2]);
}
