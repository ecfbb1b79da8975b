/* Stats of six paths, each on a page of its own, taken in turn ROUNDS
 * times between two getppid() markers (as git passes paths from its heap,
 * its stack and its libc's constants). The shim checks a page of the
 * program's memory before it reads a path there (a futex operation); a page
 * it checked is remembered until memory is unmapped or protected, so each
 * page is checked once here, not once per call.
 *
 * Usage: paths_on_many_pages DIR ROUNDS (DIR on the mount, holding files
 * f0 to f5). Prints "ok". */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PATHS 6

int main(int argc, char **argv) {
    if (argc != 3)
        return 2;
    int rounds = atoi(argv[2]);
    char *pages = mmap(NULL, PATHS * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pages == MAP_FAILED)
        return 1;
    for (int i = 0; i < PATHS; i++)
        snprintf(pages + i * 4096, 4096, "%s/f%d", argv[1], i);
    struct stat st;
    syscall(SYS_getppid);
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < PATHS; i++)
            if (lstat(pages + i * 4096, &st) != 0) {
                perror(pages + i * 4096);
                return 1;
            }
    syscall(SYS_getppid);
    puts("ok");
    return 0;
}
