/* Permissions and ownership for a program that drops root: it builds a
 * tree in DIR as root, then switches to uid/gid 65534 with supplementary
 * groups 65532 and 65531 (setgroups, setresgid, setresuid, as a server
 * dropping privileges does) and prints what each call gives ("ok" or the
 * errno name, and the owner of what it made). Run natively on ext4 and
 * under the preload shim on a mount, the outputs must be the same.
 *
 * usage: perm DIR   (DIR: an empty directory of mode 0755 owned by root) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "report.h"

static const char *dir;
static char pbuf[8][4096];
static int pn;

static const char *P(const char *rel) {
    char *b = pbuf[pn++ % 8];
    snprintf(b, 4096, "%s/%s", dir, rel);
    return b;
}


static void owner(const char *what, const char *rel) {
    struct stat st;
    if (lstat(P(rel), &st) < 0)
        printf("%s owner: %s\n", what, strerrorname_np(errno));
    else
        printf("%s owner: %u:%u mode %o\n", what, st.st_uid, st.st_gid, st.st_mode & 07777);
    fflush(stdout);
}

/* Whether `rel`'s ctime moved across `op` (given as the call's result,
 * made after the first stat: see the macro). */
static struct timespec before;
static void ctime_before(const char *rel) {
    struct stat st;
    before.tv_sec = before.tv_nsec = -1;
    if (lstat(P(rel), &st) == 0)
        before = st.st_ctim;
    usleep(10000);
}
static void ctime_after(const char *what, const char *rel, long r) {
    struct stat st;
    int moved = lstat(P(rel), &st) == 0 &&
                (st.st_ctim.tv_sec != before.tv_sec || st.st_ctim.tv_nsec != before.tv_nsec);
    printf("ctime moves on %s: %s (%s)\n", what, moved ? "yes" : "no", r < 0 ? strerrorname_np(errno) : "ok");
    fflush(stdout);
}
#define ctime_moves(what, rel, call) (ctime_before(rel), ctime_after(what, rel, call))

static int mkfile(const char *rel, mode_t mode, uid_t u, gid_t g) {
    int fd = open(P(rel), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    if (fd < 0 || write(fd, "data\n", 5) != 5 || fchown(fd, u, g) < 0 || fchmod(fd, mode) < 0)
        return -1;
    return close(fd);
}

static int mkd(const char *rel, mode_t mode, uid_t u, gid_t g) {
    if (mkdir(P(rel), 0700) < 0 || chown(P(rel), u, g) < 0 || chmod(P(rel), mode) < 0)
        return -1;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    dir = argv[1];
    /* The tree, made as root. */
    if (mkd("own", 0755, 65534, 65534) || mkd("own/d600", 0600, 65534, 65534) || mkd("rootdir", 0755, 0, 0) ||
        mkd("grpdir", 0770, 0, 65531) || mkd("sgid", 02777, 0, 65532) || mkd("sticky", 01777, 0, 0) ||
        mkd("sticky/rootsub", 0755, 0, 0) || mkd("noexec", 0766, 0, 0) ||
        mkfile("sticky/rootfile", 0666, 0, 0) || mkfile("rootfile", 0644, 0, 0) ||
        mkfile("worldw", 0666, 0, 0) || mkfile("grpw", 0664, 0, 65532) || mkfile("noexec/f", 0666, 0, 0) ||
        mkfile("own/mine", 0644, 65534, 65534)) {
        printf("setup: %s\n", strerrorname_np(errno));
        return 3;
    }
    gid_t groups[] = {65532, 65531};
    if (setgroups(2, groups) < 0 || setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0) {
        printf("dropping root: %s\n", strerrorname_np(errno));
        return 3;
    }
    /* Opening. */
    show("open own dir 0600 read-only", open(P("own/d600"), O_RDONLY | O_DIRECTORY));
    show("open rootfile for writing", open(P("rootfile"), O_WRONLY));
    show("open rootfile for reading", open(P("rootfile"), O_RDONLY));
    show("open grpw (supplementary group) for writing", open(P("grpw"), O_WRONLY));
    show("open through a directory without search permission", open(P("noexec/f"), O_RDONLY));
    show("access rootfile W_OK", access(P("rootfile"), W_OK));
    show("access grpw W_OK", access(P("grpw"), W_OK));
    show("truncate rootfile", truncate(P("rootfile"), 0));
    show("truncate worldw", truncate(P("worldw"), 1));
    /* Creating. */
    show("create in rootdir", open(P("rootdir/new"), O_CREAT | O_WRONLY, 0644));
    show("mkdir in rootdir", mkdir(P("rootdir/newd"), 0755));
    show("mkfifo in rootdir", mkfifo(P("rootdir/fifo"), 0644));
    show("mknod in rootdir", mknod(P("rootdir/node"), S_IFREG | 0644, 0));
    show("symlink in rootdir", symlink("x", P("rootdir/link")));
    show("create in own dir", open(P("own/new"), O_CREAT | O_WRONLY, 0640));
    owner("own/new", "own/new");
    show("create in grpdir (supplementary group)", open(P("grpdir/new"), O_CREAT | O_WRONLY, 0644));
    owner("grpdir/new", "grpdir/new");
    show("create in sgid dir", open(P("sgid/new"), O_CREAT | O_WRONLY, 0644));
    owner("sgid/new", "sgid/new");
    show("mkdir in own dir", mkdir(P("own/sub"), 0750));
    owner("own/sub", "own/sub");
    show("mkfifo in own dir", mkfifo(P("own/fifo"), 0600));
    owner("own/fifo", "own/fifo");
    show("symlink in own dir", symlink("mine", P("own/link")));
    owner("own/link", "own/link");
    show("link in own dir", link(P("own/mine"), P("own/hard")));
    show("link into rootdir", link(P("own/mine"), P("rootdir/hard")));
    /* Removing and renaming. */
    show("unlink rootfile (parent not writable)", unlink(P("rootfile")));
    show("unlink root's file in sticky dir", unlink(P("sticky/rootfile")));
    show("rmdir root's dir in sticky dir", rmdir(P("sticky/rootsub")));
    show("rename root's file in sticky dir", rename(P("sticky/rootfile"), P("sticky/moved")));
    show("create own file in sticky dir", open(P("sticky/mine"), O_CREAT | O_WRONLY, 0644));
    show("rename own file in sticky dir", rename(P("sticky/mine"), P("sticky/mine2")));
    show("unlink own file in sticky dir", unlink(P("sticky/mine2")));
    show("rename own file into rootdir", rename(P("own/mine"), P("rootdir/mine")));
    show("rmdir in rootdir", rmdir(P("rootdir")));
    show("unlink own hard link", unlink(P("own/hard")));
    /* Modes and owners. */
    show("chmod rootfile", chmod(P("rootfile"), 0777));
    show("chmod own file", chmod(P("own/mine"), 0600));
    show("chown own file to a supplementary group", chown(P("own/mine"), -1, 65531));
    owner("own/mine", "own/mine");
    show("chown own file to root's group", chown(P("own/mine"), -1, 0));
    show("chown own file to root", chown(P("own/mine"), 0, -1));
    show("chown rootfile to us", chown(P("rootfile"), 65534, -1));
    show("chown own file to itself", chown(P("own/mine"), 65534, -1));
    /* Times: anybody with write permission may set them to now; only the
     * owner may set other times. */
    struct timespec now[2] = {{0, UTIME_NOW}, {0, UTIME_NOW}};
    struct timespec then[2] = {{1000000000, 0}, {1000000000, 0}};
    show("utimensat now on rootfile", utimensat(AT_FDCWD, P("rootfile"), now, 0));
    show("utimensat now on worldw", utimensat(AT_FDCWD, P("worldw"), now, 0));
    show("utimensat a time on worldw", utimensat(AT_FDCWD, P("worldw"), then, 0));
    show("utimensat a time on own file", utimensat(AT_FDCWD, P("own/mine"), then, 0));
    /* Changes of the inode move its ctime (10 ms apart: far above the
     * timestamps' granularity). */
    ctime_moves("chmod", "own/mine", chmod(P("own/mine"), 0640));
    ctime_moves("link", "own/mine", link(P("own/mine"), P("own/hard2")));
    ctime_moves("rename", "own/mine", rename(P("own/hard2"), P("own/hard3")));
    ctime_moves("utimensat", "own/mine", utimensat(AT_FDCWD, P("own/mine"), then, 0));
    return 0;
}
