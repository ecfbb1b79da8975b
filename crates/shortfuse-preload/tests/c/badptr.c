/* Bad pointers handed to file calls: each line names a call and what it
 * returned (0, or the errno name). Run natively on a real directory and
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
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "report.h"

#define BAD ((const char *)0xDEADC0DEUL)


int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    char f[4096], x[4096];
    snprintf(f, sizeof f, "%s/f", argv[1]);
    snprintf(x, sizeof x, "%s/x", argv[1]);
    int fd = open(f, O_CREAT | O_RDWR, 0644);
    if (fd < 0 || write(fd, "hello", 5) != 5)
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
    /* Nothing was made outside the mount, nothing but f inside it. */
    show("rel exists", syscall(SYS_access, "rel", F_OK));
    show("x exists", syscall(SYS_access, x, F_OK));
    char buf[8] = {0};
    show("f intact", pread(fd, buf, 5, 0) == 5 && memcmp(buf, "hello", 5) == 0 ? 0 : -1);
    return 0;
}
