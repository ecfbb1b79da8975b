/* Bad pointers handed to file calls: each line names a call and what it
 * returned (0, or the errno name): paths, buffers and structs, pointers
 * the kernel reads late (after the file's own checks), empty paths
 * (AT_EMPTY_PATH) given as bad or null pointers. Run natively on a real directory and
 * under the preload shim on a mount: the outputs must be the same (the
 * kernel's copy_from_user gives EFAULT; the shim must neither fault nor
 * read the trampoline at address 0 as a path). Raw system calls, so that
 * libc checks nothing first.
 *
 * usage: badptr DIR   (DIR: an empty directory; the current directory is
 * elsewhere, and must stay empty) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "report.h"

#define BAD ((const char *)0xDEADC0DEUL)
#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452
#endif


int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    char f[4096], x[4096];
    snprintf(f, sizeof f, "%s/f", argv[1]);
    snprintf(x, sizeof x, "%s/x", argv[1]);
    int fd = open(f, O_CREAT | O_RDWR, 0644);
    if (fd < 0 || write(fd, "hello", 5) != 5)
        return 3;
    int dfd = open(argv[1], O_RDONLY | O_DIRECTORY);
    char l[4096];
    snprintf(l, sizeof l, "%s/l", argv[1]);
    int wfd = open(f, O_WRONLY), nfd = open("/dev/null", O_RDWR);
    if (dfd < 0 || wfd < 0 || nfd < 0 || symlink("f", l) < 0)
        return 3;
    struct stat st;
    struct statx stx;
    const char *bad[] = {BAD, NULL};
    const char *name[] = {"bad", "null"};
    for (int i = 0; i < 2; i++) {
        char w[64];
#define CASE(label, call) (snprintf(w, sizeof w, "%s %s", label, name[i]), show(w, call))
        CASE("open", syscall(SYS_open, bad[i], O_RDONLY));
        CASE("openat", syscall(SYS_openat, AT_FDCWD, bad[i], O_CREAT | O_WRONLY, 0644));
        CASE("stat", syscall(SYS_stat, bad[i], &st));
        CASE("lstat", syscall(SYS_lstat, bad[i], &st));
        CASE("newfstatat", syscall(SYS_newfstatat, AT_FDCWD, bad[i], &st, 0));
        CASE("statx", syscall(SYS_statx, AT_FDCWD, bad[i], 0, STATX_BASIC_STATS, &stx));
        CASE("mkdir", syscall(SYS_mkdir, bad[i], 0755));
        CASE("mkdirat", syscall(SYS_mkdirat, AT_FDCWD, bad[i], 0755));
        CASE("unlink", syscall(SYS_unlink, bad[i]));
        CASE("rmdir", syscall(SYS_rmdir, bad[i]));
        CASE("access", syscall(SYS_access, bad[i], F_OK));
        CASE("chmod", syscall(SYS_chmod, bad[i], 0600));
        CASE("truncate", syscall(SYS_truncate, bad[i], 0));
        CASE("chdir", syscall(SYS_chdir, bad[i]));
        CASE("readlink", syscall(SYS_readlink, bad[i], w, sizeof w));
        /* The target of a symbolic link is read like a path. */
        CASE("symlink target in mount", syscall(SYS_symlink, bad[i], x));
        CASE("symlink target relative", syscall(SYS_symlink, bad[i], "rel"));
        CASE("symlink name", syscall(SYS_symlink, f, bad[i]));
        CASE("rename from", syscall(SYS_rename, bad[i], x));
        CASE("rename to", syscall(SYS_rename, f, bad[i]));
        CASE("link to", syscall(SYS_link, f, bad[i]));
        /* Buffers the call fills or reads. */
        CASE("stat buffer", syscall(SYS_stat, f, bad[i]));
        CASE("fstat buffer", syscall(SYS_fstat, fd, bad[i]));
        CASE("newfstatat buffer", syscall(SYS_newfstatat, AT_FDCWD, f, bad[i], 0));
        CASE("statx buffer", syscall(SYS_statx, AT_FDCWD, f, 0, STATX_BASIC_STATS, bad[i]));
        CASE("statfs buffer", syscall(SYS_statfs, f, bad[i]));
        CASE("pread buffer", syscall(SYS_pread64, fd, bad[i], 5, 0));
        CASE("pwrite buffer", syscall(SYS_pwrite64, fd, bad[i], 5, 0));
        CASE("readlink buffer", syscall(SYS_readlink, f, bad[i], 10));
        /* Checked late: the file's own errors come first, and a read
         * with nothing to copy returns 0. */
        CASE("read buffer at the end", syscall(SYS_read, fd, bad[i], 5));
        CASE("read buffer of a dir", syscall(SYS_read, dfd, bad[i], 5));
        CASE("read buffer write-only", syscall(SYS_read, wfd, bad[i], 5));
        CASE("pread buffer at the end", syscall(SYS_pread64, fd, bad[i], 5, 5));
        CASE("preadv base at the end", syscall(SYS_preadv, fd, &(struct iovec){(void *)bad[i], 5}, 1, 5, 0));
        CASE("write buffer", syscall(SYS_write, fd, bad[i], 5));
        CASE("readv iovec", syscall(SYS_readv, fd, bad[i], 1));
        CASE("writev iovec", syscall(SYS_writev, fd, bad[i], 1));
        struct iovec iov = {(void *)bad[i], 5};
        CASE("readv base", syscall(SYS_preadv, fd, &iov, 1, 0, 0));
        CASE("writev base", syscall(SYS_pwritev, fd, &iov, 1, 0, 0));
        CASE("getdents64 buffer", syscall(SYS_getdents64, dfd, bad[i], 4096));
        CASE("fstatfs buffer", syscall(SYS_fstatfs, fd, bad[i]));
        CASE("readlinkat buffer", syscall(SYS_readlinkat, dfd, "l", bad[i], 10));
        CASE("getxattr name", syscall(SYS_getxattr, f, bad[i], w, sizeof w));
        CASE("fsetxattr value", syscall(SYS_fsetxattr, fd, "user.k", bad[i], 3, 0));
        CASE("fcntl F_GETLK", syscall(SYS_fcntl, fd, F_GETLK, bad[i]));
        CASE("fcntl F_SETLK", syscall(SYS_fcntl, fd, F_SETLK, bad[i]));
        CASE("fcntl F_OFD_GETLK", syscall(SYS_fcntl, fd, F_OFD_GETLK, bad[i]));
        CASE("fcntl F_GETLK outside", syscall(SYS_fcntl, nfd, F_GETLK, bad[i]));
        CASE("utimensat times", syscall(SYS_utimensat, AT_FDCWD, f, bad[i], 0));
        CASE("renameat2 to", syscall(SYS_renameat2, dfd, "f", dfd, bad[i], 0));
        CASE("linkat from", syscall(SYS_linkat, dfd, bad[i], dfd, "x", 0));
        CASE("symlinkat name", syscall(SYS_symlinkat, "t", dfd, bad[i]));
        CASE("unlinkat", syscall(SYS_unlinkat, dfd, bad[i], 0));
        CASE("fchownat", syscall(SYS_fchownat, dfd, bad[i], 0, 0, 0));
        CASE("fchmodat", syscall(SYS_fchmodat, dfd, bad[i], 0644));
        CASE("faccessat2", syscall(SYS_faccessat2, dfd, bad[i], F_OK, 0));
        CASE("openat2 how", syscall(SYS_openat2, dfd, "f", bad[i], 24));
        CASE("copy_file_range off_in", syscall(SYS_copy_file_range, fd, bad[i], fd, NULL, 1, 0));
        CASE("sendfile offset", syscall(SYS_sendfile, fd, fd, bad[i], 1));
        /* An empty path (AT_EMPTY_PATH) given as a bad pointer: the
         * kernel still reads it (a NULL one means the descriptor itself
         * for the calls that allow it). */
        CASE("newfstatat empty", syscall(SYS_newfstatat, fd, bad[i], &st, AT_EMPTY_PATH));
        CASE("statx empty", syscall(SYS_statx, fd, bad[i], AT_EMPTY_PATH, STATX_BASIC_STATS, &stx));
        CASE("fchownat empty", syscall(SYS_fchownat, fd, bad[i], 0, 0, AT_EMPTY_PATH));
        CASE("linkat empty", syscall(SYS_linkat, fd, bad[i], dfd, "x", AT_EMPTY_PATH));
        CASE("utimensat null or bad path", syscall(SYS_utimensat, fd, bad[i], NULL, 0));
        CASE("fchmodat2 empty", syscall(SYS_fchmodat2, fd, bad[i], 0644, AT_EMPTY_PATH));
        CASE("faccessat2 empty", syscall(SYS_faccessat2, fd, bad[i], F_OK, AT_EMPTY_PATH));
        CASE("newfstatat empty buffer", syscall(SYS_newfstatat, fd, "", bad[i], AT_EMPTY_PATH));
        /* Calls the shim does not serve: the kernel must not read the
         * trampoline at address 0 in place of the program's memory. */
        CASE("memfd_create name", syscall(SYS_memfd_create, bad[i], 0));
        CASE("mq_unlink name", syscall(SYS_mq_unlink, bad[i]));
        CASE("chroot path", syscall(SYS_chroot, bad[i]));
        CASE("mount target", syscall(SYS_mount, "none", bad[i], "tmpfs", 0, NULL));
        CASE("add_key type", syscall(SYS_add_key, bad[i], "d", NULL, 0, -2));
        CASE("nanosleep request", syscall(SYS_nanosleep, bad[i], NULL));
        CASE("uname buffer", syscall(SYS_uname, bad[i]));
        CASE("sysinfo buffer", syscall(SYS_sysinfo, bad[i]));
    }
    /* A path in a page a call found readable, then unmapped or protected:
     * the next call on it is EFAULT (the shim remembers readable pages
     * only until memory may have moved). */
    const char *how[] = {"munmap", "mprotect", "mmap fixed", "madvise guard", "fork dontfork"};
    for (int i = 0; i < 5; i++) {
        char w[64];
        char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (page == MAP_FAILED)
            return 4;
        strcpy(page, f);
        if (i == 4)
            madvise(page, 4096, MADV_DONTFORK);
        snprintf(w, sizeof w, "%s before", how[i]);
        show(w, syscall(SYS_stat, page, &st));
        switch (i) {
        case 0: munmap(page, 4096); break;
        case 1: mprotect(page, 4096, PROT_NONE); break;
        case 2: mmap(page, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0); break;
        /* MADV_GUARD_INSTALL (Linux 6.13). */
        case 3: madvise(page, 4096, 102); break;
        }
        snprintf(w, sizeof w, "%s after", how[i]);
        if (i == 4) {
            pid_t child = fork();
            if (child == 0) {
                show(w, syscall(SYS_stat, page, &st));
                _exit(0);
            }
            int status;
            waitpid(child, &status, 0);
        } else {
            show(w, syscall(SYS_stat, page, &st));
        }
    }
    /* Nothing was made outside the mount, nothing but f inside it. */
    show("rel exists", syscall(SYS_access, "rel", F_OK));
    show("x exists", syscall(SYS_access, x, F_OK));
    char buf[8] = {0};
    show("f intact", pread(fd, buf, 5, 0) == 5 && memcmp(buf, "hello", 5) == 0 ? 0 : -1);
    return 0;
}
