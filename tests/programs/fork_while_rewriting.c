/* Forks in a loop while another thread keeps running system-call
 * instructions that have never run before (copies of a getpid stub in an
 * executable buffer): under the shim each first run rewrites its site, so
 * forks land while a rewrite is under way. Each child runs a fresh site of
 * its own and exits; a child still running after 10 s counts as hung and
 * the program exits 1. Argument: the number of forks. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* mov $39,%eax; syscall; ret (getpid), padded to 16 bytes. */
static const unsigned char stub[16] = {0xb8, 39, 0, 0, 0, 0x0f, 0x05, 0xc3,
                                       0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90};
#define SLOTS (1 << 16)
static unsigned char *code;
static atomic_int next_slot;
static atomic_int stop;

/* The last slots are the children's: each child runs one. */
#define RESERVE 4096
static atomic_int child_slot = SLOTS - RESERVE;

static long run_site(int i) {
    long (*f)(void) = (long (*)(void))(code + 16 * (long)i);
    return f();
}

static void *rewriter(void *arg) {
    (void)arg;
    for (;;) {
        int i = atomic_fetch_add(&next_slot, 1);
        if (atomic_load(&stop) || i >= SLOTS - RESERVE) break;
        run_site(i);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 300;
    code = mmap(NULL, 16L * SLOTS, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) { perror("mmap"); return 2; }
    for (int i = 0; i < SLOTS; i++) memcpy(code + 16 * i, stub, 16);
    pthread_t t;
    pthread_create(&t, NULL, rewriter, NULL);
    int hung = 0;
    for (int k = 0; k < forks; k++) {
        int slot = atomic_fetch_add(&child_slot, 1);
        if (slot >= SLOTS) break;
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 2; }
        if (pid == 0) _exit(run_site(slot) == getpid() ? 0 : 3);
        int status = 0;
        struct timespec end, now;
        clock_gettime(CLOCK_MONOTONIC, &end);
        end.tv_sec += 10;
        for (;;) {
            pid_t r = waitpid(pid, &status, WNOHANG);
            if (r == pid) break;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (now.tv_sec > end.tv_sec || (now.tv_sec == end.tv_sec && now.tv_nsec > end.tv_nsec)) {
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                hung++;
                break;
            }
            usleep(1000);
        }
        if (hung) break;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "child %d: status %#x\n", k, status);
            return 1;
        }
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    printf("hung %d\n", hung);
    return hung ? 1 : 0;
}
