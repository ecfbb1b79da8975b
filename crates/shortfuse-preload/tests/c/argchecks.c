/* Arguments the kernel refuses before it looks at a file: each line names
 * a call and what it returned (0, or the errno name). Run natively on a
 * real directory and under the preload shim on a mount: the outputs must
 * be the same. Raw system calls, so that libc checks nothing first.
 *
 * usage: argchecks DIR   (DIR: an empty directory) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "report.h"

#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452
#endif

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    umask(022);
    char f[4096], slash[4096], x[4096];
    snprintf(f, sizeof f, "%s/f", argv[1]);
    snprintf(slash, sizeof slash, "%s/f/", argv[1]);
    snprintf(x, sizeof x, "%s/x", argv[1]);
    int fd = open(f, O_CREAT | O_RDWR, 0644);
    if (fd < 0 || write(fd, "hello", 5) != 5)
        return 3;
    char buf[8];
    struct iovec iov[1] = {{buf, sizeof buf}};
    /* The kernel refuses a count below 0 or above IOV_MAX (1024) before it
     * reads a buffer. */
    show("readv iovcnt -1", syscall(SYS_readv, fd, iov, -1));
    show("readv iovcnt 1025", syscall(SYS_readv, fd, iov, 1025));
    show("writev iovcnt -1", syscall(SYS_writev, fd, iov, -1));
    show("writev iovcnt 1025", syscall(SYS_writev, fd, iov, 1025));
    show("preadv iovcnt -1", syscall(SYS_preadv, fd, iov, -1, 0, 0));
    show("pwritev2 iovcnt 1025", syscall(SYS_pwritev2, fd, iov, 1025, -1, 0, 0));
    show("readv iovcnt 0", syscall(SYS_readv, fd, iov, 0));
    /* A trailing slash names a directory: on a regular file, ENOTDIR. */
    show("chmod f/", syscall(SYS_chmod, slash, 0600));
    show("fchmodat f/", syscall(SYS_fchmodat, AT_FDCWD, slash, 0600));
    show("fchmodat2 f/", syscall(SYS_fchmodat2, AT_FDCWD, slash, 0600, 0));
    show("chown f/", syscall(SYS_chown, slash, -1, -1));
    show("lchown f/", syscall(SYS_lchown, slash, -1, -1));
    show("fchownat f/", syscall(SYS_fchownat, AT_FDCWD, slash, -1, -1, 0));
    show("open f/", syscall(SYS_open, slash, O_RDONLY));
    show("unlink f/", syscall(SYS_unlink, slash));
    show("rmdir f/", syscall(SYS_rmdir, slash));
    show("rename f/", syscall(SYS_rename, slash, x));
    /* Counts and lengths the kernel refuses before it looks the path up:
     * the answer is the same for a name that does not exist. */
    char l[4096], missing[4096], out[64];
    snprintf(l, sizeof l, "%s/l", argv[1]);
    snprintf(missing, sizeof missing, "%s/missing", argv[1]);
    if (symlink("f", l) != 0)
        return 4;
    show("readlink l -1", syscall(SYS_readlink, l, out, -1));
    show("readlink l 0", syscall(SYS_readlink, l, out, 0));
    show("readlinkat l -1", syscall(SYS_readlinkat, AT_FDCWD, l, out, -1));
    show("readlink missing 0", syscall(SYS_readlink, missing, out, 0));
    show("truncate missing -1", syscall(SYS_truncate, missing, -1L));
    struct stat st;
    show("stat f", syscall(SYS_stat, f, &st));
    printf("mode %o size %ld\n", (unsigned)(st.st_mode & 07777), (long)st.st_size);
    return 0;
}
