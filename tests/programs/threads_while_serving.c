/* Creates threads (pthread_create, joined one by one) while another
 * thread keeps making file calls on a mount path: under the shim those
 * calls are served while the threads are made. A warm-up round first has
 * every system-call site of the two phases run once (the shim rewrites
 * each on its first run, one at a time); then getppid marks, for a trace,
 * where the measured round begins. Arguments: a path on the mount, the
 * number of threads. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char *path;
static atomic_long served;
static atomic_int stop;

static void *stat_loop(void *arg) {
    (void)arg;
    struct stat st;
    while (!atomic_load(&stop)) {
        if (stat(path, &st) != 0) {
            perror("stat");
            exit(1);
        }
        atomic_fetch_add(&served, 1);
    }
    return NULL;
}

static void *nothing(void *arg) { return arg; }

static void make_threads(int n) {
    for (int i = 0; i < n; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, nothing, NULL) != 0 || pthread_join(t, NULL) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            exit(1);
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s PATH THREADS\n", argv[0]);
        return 2;
    }
    path = argv[1];
    int n = atoi(argv[2]);
    make_threads(2);
    pthread_t loop;
    if (pthread_create(&loop, NULL, stat_loop, NULL) != 0) return 1;
    /* Spin without system calls: no site of ours is rewritten meanwhile. */
    while (atomic_load(&served) < 100) {
    }
    make_threads(2);
    syscall(SYS_getppid);
    long before = atomic_load(&served);
    make_threads(n);
    long during = atomic_load(&served) - before;
    atomic_store(&stop, 1);
    pthread_join(loop, NULL);
    printf("served %s\n", during > 0 ? "during" : "none");
    return 0;
}
