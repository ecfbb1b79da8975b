/* A program with a signal handler that removes a file on the mount (as
 * git's removes its lock files), making calls that go to the kernel
 * unchanged under the shim between two getppid() markers: reads, seeks and
 * a listing of files opened on a passthrough mount (kernel descriptors of
 * the backing files), a pipe's write and read, an anonymous mmap; then one
 * fstat of a mount file, which the shim serves. Then the handler runs and
 * the file is gone.
 *
 * Usage: calls_with_a_handler DIR ROUNDS (DIR on the mount, holding a file
 * "data" and a file "lock"). Prints "gone" when the handler removed the
 * lock file. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static char lock_path[4096];

static void remove_lock(int sig) {
    (void)sig;
    unlink(lock_path);
}

int main(int argc, char **argv) {
    if (argc != 3)
        return 2;
    int rounds = atoi(argv[2]);
    snprintf(lock_path, sizeof lock_path, "%s/lock", argv[1]);
    struct sigaction sa = {.sa_handler = remove_lock};
    sigaction(SIGUSR1, &sa, NULL);
    char path[4096], buf[64];
    snprintf(path, sizeof path, "%s/data", argv[1]);
    int fd = open(path, O_RDONLY);
    int dir = open(argv[1], O_RDONLY | O_DIRECTORY);
    int p[2];
    if (fd < 0 || dir < 0 || pipe(p) != 0) {
        perror("open");
        return 1;
    }
    syscall(SYS_getppid);
    for (int i = 0; i < rounds; i++) {
        if (pread(fd, buf, sizeof buf, 0) <= 0 || lseek(fd, 0, SEEK_SET) != 0 || read(fd, buf, sizeof buf) <= 0)
            return 1;
        if (lseek(dir, 0, SEEK_SET) != 0 || syscall(SYS_getdents64, dir, buf, sizeof buf) <= 0)
            return 1;
        if (write(p[1], "x", 1) != 1 || read(p[0], buf, 1) != 1)
            return 1;
        void *m = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return 1;
        munmap(m, 1 << 20);
    }
    struct stat st;
    if (fstat(fd, &st) != 0)
        return 1;
    syscall(SYS_getppid);
    raise(SIGUSR1);
    if (access(lock_path, F_OK) != 0)
        printf("gone\n");
    return 0;
}
