/* Threads released together run the same system-call sites, none run
 * before (copies of a getpid stub in an executable buffer): under the
 * shim they trap on each site at once, and one of them rewrites it.
 * Arguments: the number of threads, the number of sites. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* mov $39,%eax; syscall; ret (getpid), padded to 16 bytes. */
static const unsigned char stub[16] = {0xb8, 39, 0, 0, 0, 0x0f, 0x05, 0xc3,
                                       0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90};
static unsigned char *code;
static int sites;
static pthread_barrier_t start;
static long expected;

static void *run_sites(void *arg) {
    long bad = 0;
    pthread_barrier_wait(&start);
    for (int i = 0; i < sites; i++) {
        long (*f)(void) = (long (*)(void))(code + 16 * (long)i);
        bad += f() != expected;
    }
    return (void *)bad;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s THREADS SITES\n", argv[0]);
        return 2;
    }
    int n = atoi(argv[1]);
    sites = atoi(argv[2]);
    expected = getpid();
    code = mmap(NULL, 16 * (size_t)sites, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) return 1;
    for (int i = 0; i < sites; i++) memcpy(code + 16 * i, stub, sizeof stub);
    pthread_barrier_init(&start, NULL, (unsigned)n);
    pthread_t t[64];
    if (n < 1 || n > 64) return 2;
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], NULL, run_sites, NULL) != 0) return 1;
    long bad = 0;
    for (int i = 0; i < n; i++) {
        void *r;
        pthread_join(t[i], &r);
        bad += (long)r;
    }
    printf("bad %ld\n", bad);
    return 0;
}
