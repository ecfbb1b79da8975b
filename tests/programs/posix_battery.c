/* A battery of POSIX permission and ownership scenarios, in the families a
 * POSIX conformance suite for file systems tests (chmod, chown, link,
 * mkdir, mkfifo, mknod, open, rename, rmdir, symlink, truncate,
 * ftruncate, unlink, utimensat; sticky and set-group-ID directories;
 * clearing of the set-id bits; the path errors ENAMETOOLONG, ENOTDIR,
 * ELOOP, EEXIST).
 *
 * Root builds each scenario's files in DIR/NAME; the calls under test run
 * in a forked child that switched to another user (setgroups, setresgid,
 * setresuid) or stayed root. Every call prints one line: the scenario,
 * what was done, and "ok" or the errno name; stat lines print the type,
 * permission bits, owner, link count and size, and time lines whether a
 * time moved or equals the one set. Run on ext4 and on a mount, the two
 * outputs must be the same.
 *
 * usage: posix_battery DIR [SCENARIO...]   (DIR: empty, owned by root, mode 0755) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct cred {
    const char *name;
    uid_t uid;
    gid_t gid;
    int ngroups;
    gid_t groups[2];
};

/* The user of the scenarios: a primary group and two supplementary ones. */
static const struct cred U = {"u", 65534, 65534, 2, {65532, 65531}};
/* Another user, in none of those groups. */
static const struct cred V = {"v", 65533, 65533, 0, {0}};
/* A user whose primary group is one of U's supplementary groups. */
static const struct cred W = {"w", 65530, 65532, 0, {0}};
static const struct cred ROOT = {"root", 0, 0, 0, {0}};

static const char *base;
static const char *scen;
static char D[PATH_MAX];
static char pbuf[8][PATH_MAX + 512];
static int pn;

static const char *P(const char *rel) {
    char *b = pbuf[pn++ % 8];
    snprintf(b, sizeof pbuf[0], "%s/%s", D, rel);
    return b;
}

static void out(const char *label, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#include <stdarg.h>
static void out(const char *label, const char *fmt, ...) {
    va_list ap;
    printf("%s: %s: ", scen, label);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

/* The result of a call: ok, or the errno name. */
static long R(const char *label, long r) {
    if (r < 0)
        out(label, "%s", strerrorname_np(errno));
    else
        out(label, "ok");
    return r;
}

/* Opens and closes at once: the result of the open. */
static void O(const char *label, const char *rel, int flags, mode_t mode) {
    int fd = open(P(rel), flags, mode);
    R(label, fd);
    if (fd >= 0)
        close(fd);
}

static const char *kind(mode_t m) {
    switch (m & S_IFMT) {
    case S_IFREG: return "reg";
    case S_IFDIR: return "dir";
    case S_IFLNK: return "lnk";
    case S_IFIFO: return "fifo";
    case S_IFCHR: return "chr";
    case S_IFBLK: return "blk";
    case S_IFSOCK: return "sock";
    }
    return "?";
}

static void show_stat(const char *label, const struct stat *st) {
    char size[32] = "";
    if (!S_ISDIR(st->st_mode))
        snprintf(size, sizeof size, " size %lld", (long long)st->st_size);
    char dev[32] = "";
    if (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode))
        snprintf(dev, sizeof dev, " rdev %u,%u", major(st->st_rdev), minor(st->st_rdev));
    out(label, "%s %04o %u:%u nlink %lu%s%s", kind(st->st_mode), st->st_mode & 07777, st->st_uid, st->st_gid,
        (unsigned long)st->st_nlink, size, dev);
}

/* lstat of rel. */
static void ST(const char *label, const char *rel) {
    struct stat st;
    if (lstat(P(rel), &st) < 0)
        out(label, "%s", strerrorname_np(errno));
    else
        show_stat(label, &st);
}

static void FST(const char *label, int fd) {
    struct stat st;
    if (fstat(fd, &st) < 0)
        out(label, "%s", strerrorname_np(errno));
    else
        show_stat(label, &st);
}

/* Times: snap() records rel's times and waits long enough for any clock
 * to tick; moved() says which of them changed since. */
static struct stat snapped;
static void snap(const char *rel) {
    memset(&snapped, 0, sizeof snapped);
    lstat(P(rel), &snapped);
    usleep(20000);
}
static int ts_eq(struct timespec a, struct timespec b) { return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec; }
static void moved(const char *label, const char *rel) {
    struct stat st;
    if (lstat(P(rel), &st) < 0) {
        out(label, "%s", strerrorname_np(errno));
        return;
    }
    out(label, "ctime %s, mtime %s", ts_eq(st.st_ctim, snapped.st_ctim) ? "same" : "moved",
        ts_eq(st.st_mtim, snapped.st_mtim) ? "same" : "moved");
}
/* Whether rel's atime and mtime are the given ones (UTIME_OMIT: unchanged since snap). */
static void times_are(const char *label, const char *rel, const struct timespec want[2]) {
    struct stat st;
    if (lstat(P(rel), &st) < 0) {
        out(label, "%s", strerrorname_np(errno));
        return;
    }
    const char *what[2];
    struct timespec got[2] = {st.st_atim, st.st_mtim};
    struct timespec had[2] = {snapped.st_atim, snapped.st_mtim};
    for (int i = 0; i < 2; i++) {
        if (want[i].tv_nsec == UTIME_OMIT)
            what[i] = ts_eq(got[i], had[i]) ? "kept" : "changed";
        else if (want[i].tv_nsec == UTIME_NOW)
            what[i] = got[i].tv_sec >= time(NULL) - 60 ? "now" : "not now";
        else
            what[i] = ts_eq(got[i], want[i]) ? "as set" : "not as set";
    }
    out(label, "atime %s, mtime %s", what[0], what[1]);
}

/* Root's setup: a file or directory with the given bits and owner (chmod
 * after chown, which clears set-id bits). */
static void mkf(const char *rel, mode_t mode, uid_t u, gid_t g) {
    int fd = open(P(rel), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    if (fd < 0 || write(fd, "data\n", 5) != 5 || fchown(fd, u, g) < 0 || fchmod(fd, mode) < 0) {
        out("setup", "file %s: %s", rel, strerrorname_np(errno));
        exit(3);
    }
    close(fd);
}
static void mkd(const char *rel, mode_t mode, uid_t u, gid_t g) {
    if (mkdir(P(rel), 0700) < 0 || chown(P(rel), u, g) < 0 || chmod(P(rel), mode) < 0) {
        out("setup", "dir %s: %s", rel, strerrorname_np(errno));
        exit(3);
    }
}
static void mkl(const char *target, const char *rel) {
    if (symlink(target, P(rel)) < 0) {
        out("setup", "symlink %s: %s", rel, strerrorname_np(errno));
        exit(3);
    }
}

/* AS(cred) { ... }: the block runs in a child with those credentials;
 * the parent waits for it. */
static int as_begin(const struct cred *c) {
    fflush(stdout);
    pid_t p = fork();
    if (p < 0) {
        out("fork", "%s", strerrorname_np(errno));
        exit(3);
    }
    if (p > 0) {
        int st;
        if (waitpid(p, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            out("child", "as %s ended with status 0x%x", c->name, st);
        return 0;
    }
    if (c->uid != 0 &&
        (setgroups(c->ngroups, c->groups) < 0 || setresgid(c->gid, c->gid, c->gid) < 0 ||
         setresuid(c->uid, c->uid, c->uid) < 0)) {
        out("switching user", "%s", strerrorname_np(errno));
        _exit(3);
    }
    return 1;
}
static int as_end(void) {
    fflush(stdout);
    _exit(0);
}
#define AS(c) for (int once_ = as_begin(&(c)); once_; once_ = as_end())

/* Each scenario in its own directory DIR/NAME, root's, mode 0755. */
static void begin(const char *name) {
    scen = name;
    snprintf(D, sizeof D, "%s/%s", base, name);
    if (mkdir(D, 0755) < 0) {
        out("setup", "mkdir: %s", strerrorname_np(errno));
        exit(3);
    }
}

static const struct timespec T1[2] = {{1000000000, 123456789}, {1100000000, 987654321}};
static const struct timespec TNOW[2] = {{0, UTIME_NOW}, {0, UTIME_NOW}};
static const struct timespec TOMIT[2] = {{0, UTIME_OMIT}, {0, UTIME_OMIT}};
/* Nanoseconds out of range: EINVAL before the path is looked at. */
static const struct timespec TBADNS[2] = {{1000000000, 1000000000}, {0, UTIME_OMIT}};
static const struct timespec TNEGNS[2] = {{0, UTIME_NOW}, {1000000000, -1}};
static const struct timespec TNOW_OMIT[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
static const struct timespec TSET_OMIT[2] = {{1000000000, 5}, {0, UTIME_OMIT}};
static const struct timespec TNOW_SET[2] = {{0, UTIME_NOW}, {1000000000, 5}};

static void sc_chmod(void) {
    begin("chmod");
    mkd("d", 0777, 0, 0);
    mkf("d/mine", 0644, U.uid, U.gid);
    mkf("d/root", 0644, 0, 0);
    mkf("d/mine_g0", 0644, U.uid, 0);
    mkd("d/mydir", 0755, U.uid, U.gid);
    mkd("nox", 0766, 0, 0);
    mkf("nox/mine", 0644, U.uid, U.gid);
    mkl("mine", "d/link");
    AS(U) {
        snap("d/mine");
        R("owner chmod 0600", chmod(P("d/mine"), 0600));
        ST("after", "d/mine");
        moved("times after chmod", "d/mine");
        R("non-owner chmod", chmod(P("d/root"), 0600));
        ST("root's after", "d/root");
        R("owner chmod 04755", chmod(P("d/mine"), 04755));
        ST("after 04755", "d/mine");
        R("owner chmod 02755 in own group", chmod(P("d/mine"), 02755));
        ST("after 02755", "d/mine");
        R("owner chmod 02755 in a group not held", chmod(P("d/mine_g0"), 02755));
        ST("sgid dropped", "d/mine_g0");
        R("owner chmod 01644 on a file", chmod(P("d/mine"), 01644));
        ST("after 01644", "d/mine");
        R("owner chmod 03777 on own dir", chmod(P("d/mydir"), 03777));
        ST("dir after", "d/mydir");
        R("chmod through a symlink", chmod(P("d/link"), 0640));
        ST("target after", "d/mine");
        R("fchmodat NOFOLLOW on a symlink", fchmodat(AT_FDCWD, P("d/link"), 0600, AT_SYMLINK_NOFOLLOW));
        R("chmod without search permission", chmod(P("nox/mine"), 0600));
        R("chmod of a missing file", chmod(P("d/none"), 0600));
        int fd = open(P("d/mine"), O_RDONLY);
        R("fchmod own file on a read-only fd", fchmod(fd, 0604));
        FST("after fchmod", fd);
        close(fd);
        fd = open(P("d/root"), O_RDONLY);
        R("fchmod root's file", fchmod(fd, 0666));
        close(fd);
    }
    AS(V) {
        R("another user chmod of u's file", chmod(P("d/mine"), 0777));
    }
    AS(ROOT) {
        R("root chmod of u's file 06777", chmod(P("d/mine"), 06777));
        ST("after", "d/mine");
    }
}

static void sc_chown(void) {
    begin("chown");
    mkd("d", 0777, 0, 0);
    mkf("d/mine", 0644, U.uid, U.gid);
    mkf("d/root", 0644, 0, 0);
    mkf("d/suid", 06755, U.uid, U.gid);
    mkf("d/sgid_nx", 02745, U.uid, U.gid);
    mkd("d/sgiddir", 02755, U.uid, U.gid);
    mkl("mine", "d/link");
    AS(U) {
        snap("d/mine");
        R("owner chown to a supplementary group", chown(P("d/mine"), -1, 65531));
        ST("after", "d/mine");
        moved("times after chown", "d/mine");
        R("owner chown to the other supplementary group", chown(P("d/mine"), -1, 65532));
        R("owner chown to the primary group", chown(P("d/mine"), -1, U.gid));
        R("owner chown to a group not held", chown(P("d/mine"), -1, 0));
        R("owner chown to another uid", chown(P("d/mine"), V.uid, -1));
        R("owner chown to own uid", chown(P("d/mine"), U.uid, -1));
        R("non-owner chown -1 -1", chown(P("d/root"), -1, -1));
        R("non-owner chown to own group", chown(P("d/root"), -1, 65531));
        snap("d/mine");
        R("owner chown -1 -1", chown(P("d/mine"), -1, -1));
        moved("times after chown -1 -1", "d/mine");
        R("owner chown of 06755 to a group", chown(P("d/suid"), -1, 65532));
        ST("set-id bits after", "d/suid");
        R("owner chown of 02745 to a group", chown(P("d/sgid_nx"), -1, 65532));
        ST("02745 after", "d/sgid_nx");
        R("owner chown of a 02755 dir", chown(P("d/sgiddir"), -1, 65532));
        ST("dir after", "d/sgiddir");
        R("lchown of the symlink", lchown(P("d/link"), -1, 65531));
        ST("symlink after", "d/link");
        int fd = open(P("d/mine"), O_RDONLY);
        R("fchown own file", fchown(fd, -1, 65532));
        FST("after fchown", fd);
        close(fd);
    }
    AS(ROOT) {
        mkf("d/r1", 06755, U.uid, U.gid);
        R("root chown 06755 to another uid", chown(P("d/r1"), V.uid, -1));
        ST("after", "d/r1");
        mkf("d/r2", 06755, U.uid, U.gid);
        R("root chown -1 -1 of 06755", chown(P("d/r2"), -1, -1));
        ST("after -1 -1", "d/r2");
        mkf("d/r3", 02745, U.uid, U.gid);
        R("root chown 02745 to another gid", chown(P("d/r3"), -1, 0));
        ST("02745 after", "d/r3");
        R("root chown through a symlink", chown(P("d/link"), 0, 0));
        ST("target after", "d/mine");
        ST("symlink after", "d/link");
    }
}

static void sc_setid_write(void) {
    begin("setid_write");
    mkd("d", 0777, 0, 0);
    static const mode_t modes[] = {04777, 02777, 06777, 02767, 04766};
    char name[32];
    for (unsigned i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        snprintf(name, sizeof name, "d/r%o", modes[i]);
        mkf(name, modes[i], 0, 0);
        snprintf(name, sizeof name, "d/u%o", modes[i]);
        mkf(name, modes[i], U.uid, U.gid);
        snprintf(name, sizeof name, "d/t%o", modes[i]);
        mkf(name, modes[i], 0, 0);
        snprintf(name, sizeof name, "d/f%o", modes[i]);
        mkf(name, modes[i], 0, 0);
    }
    AS(U) {
        for (unsigned i = 0; i < sizeof modes / sizeof modes[0]; i++) {
            char label[64];
            snprintf(name, sizeof name, "d/r%o", modes[i]);
            int fd = open(P(name), O_WRONLY);
            snprintf(label, sizeof label, "write root's %o", modes[i]);
            R(label, fd < 0 ? -1 : write(fd, "x", 1));
            if (fd >= 0) {
                snprintf(label, sizeof label, "root's %o after the write", modes[i]);
                FST(label, fd);
                close(fd);
            }
            snprintf(name, sizeof name, "d/u%o", modes[i]);
            fd = open(P(name), O_WRONLY);
            snprintf(label, sizeof label, "write own %o", modes[i]);
            R(label, fd < 0 ? -1 : write(fd, "x", 1));
            if (fd >= 0) {
                snprintf(label, sizeof label, "own %o after the write", modes[i]);
                FST(label, fd);
                close(fd);
            }
            snprintf(name, sizeof name, "d/t%o", modes[i]);
            snprintf(label, sizeof label, "truncate root's %o", modes[i]);
            R(label, truncate(P(name), 2));
            snprintf(label, sizeof label, "root's %o after truncate", modes[i]);
            ST(label, name);
            snprintf(name, sizeof name, "d/f%o", modes[i]);
            fd = open(P(name), O_WRONLY);
            snprintf(label, sizeof label, "ftruncate root's %o", modes[i]);
            R(label, fd < 0 ? -1 : ftruncate(fd, 3));
            if (fd >= 0) {
                snprintf(label, sizeof label, "root's %o after ftruncate", modes[i]);
                FST(label, fd);
                close(fd);
            }
        }
    }
    AS(ROOT) {
        mkf("d/rootw", 06777, U.uid, U.gid);
        int fd = open(P("d/rootw"), O_WRONLY);
        R("root writes u's 06777", write(fd, "x", 1));
        FST("after root's write", fd);
        close(fd);
    }
}

static void sc_create(void) {
    begin("create");
    mkd("ro", 0755, 0, 0);
    mkd("pub", 0777, 0, 0);
    mkd("grp", 0770, 0, 65531);
    mkd("grpro", 0750, 0, 65531);
    mkd("sgid", 02777, 0, 65532);
    mkd("sgid0", 02777, 0, 0);
    mkd("mine", 0700, U.uid, U.gid);
    mkd("nox", 0766, 0, 0);
    mkf("pub/exists", 0644, 0, 0);
    mkf("pub/ro_mine", 0444, U.uid, U.gid);
    mkf("pub/rw", 0666, 0, 0);
    mkl("nowhere", "pub/dangling");
    mkl("made-through-link", "pub/dangling2");
    mkf("pub/file", 0644, 0, 0);
    AS(U) {
        umask(022);
        O("open O_CREAT in a read-only dir", "ro/f", O_CREAT | O_WRONLY, 0644);
        R("mkdir in a read-only dir", mkdir(P("ro/d"), 0755));
        R("mkfifo in a read-only dir", mkfifo(P("ro/p"), 0644));
        R("mknod S_IFREG in a read-only dir", mknod(P("ro/n"), S_IFREG | 0644, 0));
        R("symlink in a read-only dir", symlink("x", P("ro/l")));
        O("open O_CREAT without search permission", "nox/f", O_CREAT | O_WRONLY, 0644);
        snap("pub");
        O("open O_CREAT 0777 (umask 022)", "pub/f", O_CREAT | O_WRONLY, 0777);
        ST("made", "pub/f");
        moved("parent after create", "pub");
        O("open O_CREAT 04777", "pub/fs", O_CREAT | O_WRONLY, 04777);
        ST("made with set-uid", "pub/fs");
        O("open O_CREAT 02777 in a group held", "pub/fg", O_CREAT | O_WRONLY, 02777);
        ST("made with set-gid", "pub/fg");
        R("mkdir 0777", mkdir(P("pub/d"), 0777));
        ST("made dir", "pub/d");
        R("mkdir 01777", mkdir(P("pub/dt"), 01777));
        ST("made sticky dir", "pub/dt");
        R("mkdir 02777 (set-gid asked)", mkdir(P("pub/dg"), 02777));
        ST("made dir asked set-gid", "pub/dg");
        R("mkfifo 0666", mkfifo(P("pub/p"), 0666));
        ST("made fifo", "pub/p");
        R("mknod S_IFREG", mknod(P("pub/n"), S_IFREG | 0666, 0));
        ST("made node", "pub/n");
        R("mknod S_IFIFO", mknod(P("pub/np"), S_IFIFO | 0600, 0));
        ST("made fifo node", "pub/np");
        R("mknod S_IFCHR as a user", mknod(P("pub/c"), S_IFCHR | 0600, makedev(1, 3)));
        R("mknod S_IFBLK as a user", mknod(P("pub/b"), S_IFBLK | 0600, makedev(7, 0)));
        R("mknod S_IFSOCK", mknod(P("pub/s"), S_IFSOCK | 0600, 0));
        ST("made socket node", "pub/s");
        R("symlink", symlink("target", P("pub/l")));
        ST("made symlink", "pub/l");
        O("O_CREAT in a dir writable through a supplementary group", "grp/f", O_CREAT | O_WRONLY, 0644);
        ST("made in grp", "grp/f");
        O("O_CREAT in a group dir without group write", "grpro/f", O_CREAT | O_WRONLY, 0644);
        O("O_CREAT in a set-gid dir", "sgid/f", O_CREAT | O_WRONLY, 0644);
        ST("made in set-gid dir", "sgid/f");
        O("O_CREAT 02755 in a set-gid dir of a held group", "sgid/fg", O_CREAT | O_WRONLY, 02755);
        ST("made 02755 in set-gid dir", "sgid/fg");
        O("O_CREAT 02755 in a set-gid dir of a group not held", "sgid0/fg", O_CREAT | O_WRONLY, 02755);
        ST("made 02755 in set-gid dir of group 0", "sgid0/fg");
        R("mkdir in a set-gid dir", mkdir(P("sgid/d"), 0755));
        ST("dir made in set-gid dir", "sgid/d");
        R("mkdir in a set-gid dir of a group not held", mkdir(P("sgid0/d"), 0755));
        ST("dir made in set-gid dir of group 0", "sgid0/d");
        R("mkfifo in a set-gid dir", mkfifo(P("sgid/p"), 0644));
        ST("fifo made in set-gid dir", "sgid/p");
        R("symlink in a set-gid dir", symlink("x", P("sgid/l")));
        ST("symlink made in set-gid dir", "sgid/l");
        O("O_CREAT|O_EXCL on an existing file", "pub/exists", O_CREAT | O_EXCL | O_WRONLY, 0644);
        O("O_CREAT|O_EXCL on a dangling symlink", "pub/dangling", O_CREAT | O_EXCL | O_WRONLY, 0644);
        O("O_CREAT on a dangling symlink", "pub/dangling2", O_CREAT | O_WRONLY, 0644);
        ST("made through the symlink", "pub/made-through-link");
        O("O_CREAT read-only on root's existing 0644", "pub/exists", O_CREAT | O_RDONLY, 0644);
        O("O_CREAT write on root's existing 0644", "pub/exists", O_CREAT | O_WRONLY, 0644);
        O("O_TRUNC on root's 0644", "pub/exists", O_RDONLY | O_TRUNC, 0);
        O("O_CREAT|O_TRUNC on own 0444", "pub/ro_mine", O_CREAT | O_TRUNC | O_WRONLY, 0644);
        O("O_RDONLY|O_TRUNC on a writable file", "pub/rw", O_RDONLY | O_TRUNC, 0);
        ST("after O_RDONLY|O_TRUNC", "pub/rw");
        O("open own 0444 for writing", "pub/ro_mine", O_WRONLY, 0);
        O("open a dir for writing", "pub/d", O_WRONLY, 0);
        O("open a dir O_RDWR", "pub/d", O_RDWR, 0);
        O("open O_CREAT on a dir", "pub/d", O_CREAT | O_RDONLY, 0644);
        O("open O_DIRECTORY on a file", "pub/file", O_RDONLY | O_DIRECTORY, 0);
        O("open O_NOFOLLOW on a symlink", "pub/l", O_RDONLY | O_NOFOLLOW, 0);
        O("open a file with a trailing slash", "pub/file/", O_RDONLY, 0);
        O("O_CREAT with a trailing slash", "pub/newslash/", O_CREAT | O_WRONLY, 0644);
        O("open O_WRONLY|O_NONBLOCK on a fifo without reader", "pub/p", O_WRONLY | O_NONBLOCK, 0);
        O("open O_RDONLY|O_NONBLOCK on a fifo", "pub/p", O_RDONLY | O_NONBLOCK, 0);
        R("mkdir over an existing file", mkdir(P("pub/exists"), 0755));
        R("mkfifo over an existing file", mkfifo(P("pub/exists"), 0644));
        R("mknod over an existing file", mknod(P("pub/exists"), S_IFREG | 0644, 0));
        R("symlink over an existing file", symlink("x", P("pub/exists")));
        R("symlink over a dangling symlink", symlink("x", P("pub/dangling")));
        R("mkdir over a dangling symlink", mkdir(P("pub/dangling"), 0755));
    }
    AS(ROOT) {
        umask(022);
        R("root mknod S_IFCHR", mknod(P("pub/rc"), S_IFCHR | 0644, makedev(1, 3)));
        ST("made chr", "pub/rc");
        R("root mknod S_IFBLK", mknod(P("pub/rb"), S_IFBLK | 0644, makedev(7, 200)));
        ST("made blk", "pub/rb");
        O("root O_CREAT in u's 0700 dir", "mine/rootmade", O_CREAT | O_WRONLY, 0644);
        ST("root's file in u's dir", "mine/rootmade");
        R("root mkdir in a set-gid dir", mkdir(P("sgid/rd"), 0755));
        ST("root's dir in set-gid dir", "sgid/rd");
        O("root O_CREAT 02755 in a set-gid dir", "sgid/rf", O_CREAT | O_WRONLY, 02755);
        ST("root's 02755 in set-gid dir", "sgid/rf");
    }
}

static void sc_open_access(void) {
    begin("open");
    mkd("own", 0755, U.uid, U.gid);
    mkd("own/d600", 0600, U.uid, U.gid);
    mkd("own/d300", 0300, U.uid, U.gid);
    mkf("own/d300/f", 0644, U.uid, U.gid);
    mkf("r600", 0600, 0, 0);
    mkf("r644", 0644, 0, 0);
    mkf("r640g", 0640, 0, 65531);
    mkf("r620g", 0620, 0, 65532);
    mkf("r604", 0604, 0, 65531);
    mkf("u000", 0000, U.uid, U.gid);
    mkf("u044", 0044, U.uid, U.gid);
    mkf("r755", 0755, 0, 0);
    mkf("r644x", 0644, 0, 0);
    mkf("wonly", 0622, 0, 0);
    AS(U) {
        O("own dir 0600 read-only", "own/d600", O_RDONLY | O_DIRECTORY, 0);
        O("own dir 0600 read-only (no O_DIRECTORY)", "own/d600", O_RDONLY, 0);
        ST("stat through own dir 0600", "own/d600/x");
        O("own dir 0300 read-only", "own/d300", O_RDONLY | O_DIRECTORY, 0);
        O("file in own dir 0300", "own/d300/f", O_RDONLY, 0);
        O("root's 0600 read", "r600", O_RDONLY, 0);
        O("root's 0644 read", "r644", O_RDONLY, 0);
        O("root's 0644 write", "r644", O_WRONLY, 0);
        O("group 0640 read through a supplementary group", "r640g", O_RDONLY, 0);
        O("group 0640 write", "r640g", O_WRONLY, 0);
        O("group 0620 write through a supplementary group", "r620g", O_WRONLY, 0);
        O("group 0620 read", "r620g", O_RDONLY, 0);
        O("0604 of a held group: read (group bits decide)", "r604", O_RDONLY, 0);
        O("own 0000 read", "u000", O_RDONLY, 0);
        O("own 0044 read (owner bits decide)", "u044", O_RDONLY, 0);
        O("0622 write-only by others", "wonly", O_WRONLY, 0);
        R("access r644 R_OK", access(P("r644"), R_OK));
        R("access r644 W_OK", access(P("r644"), W_OK));
        R("access r644 X_OK", access(P("r644"), X_OK));
        R("access r755 X_OK", access(P("r755"), X_OK));
        R("access r620g W_OK", access(P("r620g"), W_OK));
        R("access u000 F_OK", access(P("u000"), F_OK));
        R("access own/d300 R_OK", access(P("own/d300"), R_OK));
        R("faccessat AT_EACCESS r640g R_OK", faccessat(AT_FDCWD, P("r640g"), R_OK, AT_EACCESS));
    }
    AS(V) {
        O("0604 read by another user", "r604", O_RDONLY, 0);
        O("group 0640 read by a non-member", "r640g", O_RDONLY, 0);
    }
    AS(W) {
        O("group 0620 write through the primary group", "r620g", O_WRONLY, 0);
    }
    AS(ROOT) {
        O("root reads u's 0000", "u000", O_RDONLY, 0);
        O("root writes u's 0000", "u000", O_RDWR, 0);
        R("root access X_OK on 0644", access(P("r644x"), X_OK));
        R("root access X_OK on 0755", access(P("r755"), X_OK));
        R("root access W_OK on 0000", access(P("u000"), W_OK));
        O("root opens u's dir 0300 for reading", "own/d300", O_RDONLY | O_DIRECTORY, 0);
    }
}

static void sc_link(void) {
    begin("link");
    mkd("pub", 0777, 0, 0);
    mkd("ro", 0755, 0, 0);
    mkf("pub/mine", 0644, U.uid, U.gid);
    mkf("pub/root600", 0600, 0, 0);
    mkf("pub/root666", 0666, 0, 0);
    mkf("pub/other", 0644, 0, 0);
    mkd("pub/dir", 0755, U.uid, U.gid);
    mkf("ro/f", 0644, 0, 0);
    AS(U) {
        snap("pub/mine");
        R("link own file", link(P("pub/mine"), P("pub/mine2")));
        ST("after", "pub/mine");
        moved("times after link", "pub/mine");
        R("link into a read-only dir", link(P("pub/mine"), P("ro/mine")));
        R("link root's 0600 (protected_hardlinks)", link(P("pub/root600"), P("pub/r600")));
        R("link root's 0666", link(P("pub/root666"), P("pub/r666")));
        R("link a dir", link(P("pub/dir"), P("pub/dir2")));
        R("link over an existing name", link(P("pub/mine"), P("pub/other")));
        R("link of a missing file", link(P("pub/none"), P("pub/none2")));
        R("link from a read-only dir", link(P("ro/f"), P("pub/rof")));
        snap("pub/mine");
        R("unlink one of two links", unlink(P("pub/mine2")));
        ST("after unlink", "pub/mine");
        moved("times after unlink of the other name", "pub/mine");
    }
}

static void sc_sticky(void) {
    begin("sticky");
    mkd("st", 01777, 0, 0);
    mkd("stu", 01777, U.uid, U.gid);
    mkf("st/root", 0666, 0, 0);
    mkf("st/mine", 0644, U.uid, U.gid);
    mkf("st/vs", 0666, V.uid, V.gid);
    mkd("st/rootdir", 0777, 0, 0);
    mkd("st/vdir", 0777, V.uid, V.gid);
    mkf("stu/vs", 0644, V.uid, V.gid);
    mkf("st/target", 0644, U.uid, U.gid);
    AS(U) {
        R("unlink root's file", unlink(P("st/root")));
        R("rename root's file", rename(P("st/root"), P("st/moved")));
        R("rename own file over root's", rename(P("st/mine"), P("st/root")));
        R("rename own file over v's", rename(P("st/mine"), P("st/vs")));
        R("rmdir root's dir", rmdir(P("st/rootdir")));
        R("rename root's dir", rename(P("st/rootdir"), P("st/rd2")));
        R("unlink v's file in own sticky dir", unlink(P("stu/vs")));
        R("rename own file", rename(P("st/mine"), P("st/mine2")));
        R("rename own file over own file", rename(P("st/mine2"), P("st/target")));
        R("unlink own file", unlink(P("st/target")));
        R("create in sticky dir", open(P("st/new"), O_CREAT | O_WRONLY, 0644) >= 0 ? 0 : -1);
    }
    AS(V) {
        R("v renames its dir", rename(P("st/vdir"), P("st/vdir2")));
        R("v unlinks u's new file", unlink(P("st/new")));
    }
    AS(ROOT) {
        R("root unlinks v's file", unlink(P("st/vs")));
    }
}

static void sc_rename(void) {
    begin("rename");
    mkd("pub", 0777, 0, 0);
    mkd("pub2", 0777, 0, 0);
    mkd("ro", 0755, 0, 0);
    mkf("pub/f", 0644, U.uid, U.gid);
    mkf("pub/g", 0644, U.uid, U.gid);
    mkd("pub/d", 0755, U.uid, U.gid);
    mkd("pub/d/sub", 0755, U.uid, U.gid);
    mkd("pub/full", 0755, U.uid, U.gid);
    mkf("pub/full/x", 0644, U.uid, U.gid);
    mkd("pub/empty", 0755, U.uid, U.gid);
    mkd("pub/rootd", 0755, 0, 0);
    mkd("pub/rootd2", 0755, 0, 0);
    mkf("ro/f", 0644, U.uid, U.gid);
    mkf("pub/h", 0644, U.uid, U.gid);
    AS(U) {
        snap("pub/f");
        R("rename a file", rename(P("pub/f"), P("pub/f2")));
        moved("times of the renamed file", "pub/f2");
        R("rename a file over a file", rename(P("pub/f2"), P("pub/g")));
        ST("the survivor", "pub/g");
        R("rename a file over a dir", rename(P("pub/g"), P("pub/empty")));
        R("rename a dir over a file", rename(P("pub/empty"), P("pub/g")));
        R("rename a dir over a non-empty dir", rename(P("pub/empty"), P("pub/full")));
        R("rename a dir into its own subdir", rename(P("pub/d"), P("pub/d/sub/x")));
        R("rename out of a read-only dir", rename(P("ro/f"), P("pub/rof")));
        R("rename into a read-only dir", rename(P("pub/g"), P("ro/g")));
        R("rename root's dir to another parent (no write on it)", rename(P("pub/rootd"), P("pub2/rootd")));
        R("rename root's dir within its parent", rename(P("pub/rootd2"), P("pub/rootd3")));
        R("rename own dir to another parent", rename(P("pub/d"), P("pub2/d")));
        ST("moved dir", "pub2/d");
        R("rename a dir over an empty dir", rename(P("pub2/d"), P("pub/empty")));
        R("link h to h2", link(P("pub/h"), P("pub/h2")));
        R("rename a link over the other name of the same file", rename(P("pub/h"), P("pub/h2")));
        ST("both names after", "pub/h");
        R("rename to a missing dir", rename(P("pub/g"), P("pub/none/g")));
        R("rename through a file", rename(P("pub/g"), P("pub/g/x")));
        R("rename a missing file", rename(P("pub/none"), P("pub/none2")));
        R("rename .", rename(P("pub/full/."), P("pub/x")));
    }
}

static void sc_rmdir_unlink(void) {
    begin("remove");
    mkd("pub", 0777, 0, 0);
    mkd("ro", 0755, 0, 0);
    mkd("ro/d", 0777, U.uid, U.gid);
    mkf("ro/f", 0666, U.uid, U.gid);
    mkd("pub/full", 0777, U.uid, U.gid);
    mkf("pub/full/x", 0644, U.uid, U.gid);
    mkd("pub/empty", 0755, 0, 0);
    mkd("pub/e2", 0755, U.uid, U.gid);
    mkf("pub/f", 0644, 0, 0);
    mkd("nox", 0666, 0, 0);
    mkd("nox/d", 0777, 0, 0);
    AS(U) {
        R("rmdir in a read-only dir", rmdir(P("ro/d")));
        R("unlink in a read-only dir", unlink(P("ro/f")));
        R("rmdir a non-empty dir", rmdir(P("pub/full")));
        R("rmdir a file", rmdir(P("pub/f")));
        R("unlink a dir", unlink(P("pub/e2")));
        R("rmdir .", rmdir(P("pub/e2/.")));
        R("rmdir ..", rmdir(P("pub/e2/..")));
        R("rmdir without search permission", rmdir(P("nox/d")));
        snap("pub");
        R("rmdir root's empty dir in a public dir", rmdir(P("pub/empty")));
        moved("parent after rmdir", "pub");
        R("rmdir a missing dir", rmdir(P("pub/none")));
        R("unlink through a file", unlink(P("pub/f/x")));
        snap("pub");
        R("unlink root's file in a public dir", unlink(P("pub/f")));
        moved("parent after unlink", "pub");
    }
}

static void sc_truncate(void) {
    begin("truncate");
    mkd("d", 0755, 0, 0);
    mkf("d/mine", 0644, U.uid, U.gid);
    mkf("d/root", 0644, 0, 0);
    mkf("d/rw", 0666, 0, 0);
    mkd("d/dir", 0777, U.uid, U.gid);
    AS(U) {
        snap("d/mine");
        R("truncate own file", truncate(P("d/mine"), 100));
        ST("after", "d/mine");
        moved("times after truncate", "d/mine");
        snap("d/mine");
        R("truncate to the same size", truncate(P("d/mine"), 100));
        moved("times after truncate to the same size", "d/mine");
        R("truncate root's 0644", truncate(P("d/root"), 0));
        R("truncate root's 0666", truncate(P("d/rw"), 1));
        R("truncate a dir", truncate(P("d/dir"), 0));
        R("truncate to a negative size", truncate(P("d/mine"), -1));
        R("truncate a missing file", truncate(P("d/none"), 0));
        int fd = open(P("d/mine"), O_RDONLY);
        R("ftruncate a read-only fd", ftruncate(fd, 0));
        close(fd);
        fd = open(P("d/mine"), O_WRONLY);
        R("chmod 0444 while open for writing", chmod(P("d/mine"), 0444));
        snap("d/mine");
        R("ftruncate after chmod 0444", ftruncate(fd, 7));
        FST("after ftruncate", fd);
        moved("times after ftruncate", "d/mine");
        R("ftruncate to a negative size", ftruncate(fd, -1));
        close(fd);
        fd = open(P("d/dir"), O_RDONLY | O_DIRECTORY);
        R("ftruncate a dir", ftruncate(fd, 0));
        close(fd);
        R("truncate own 0444", truncate(P("d/mine"), 0));
    }
}

static void sc_utimens(void) {
    begin("utimens");
    mkd("d", 0755, 0, 0);
    mkf("d/mine", 0644, U.uid, U.gid);
    mkf("d/root644", 0644, 0, 0);
    mkf("d/root666", 0666, 0, 0);
    mkf("d/grp660", 0660, 0, 65531);
    mkl("mine", "d/link");
    AS(U) {
        snap("d/mine");
        R("owner sets times", utimensat(AT_FDCWD, P("d/mine"), T1, 0));
        times_are("after", "d/mine", T1);
        moved("ctime after utimensat", "d/mine");
        snap("d/mine");
        R("owner UTIME_NOW", utimensat(AT_FDCWD, P("d/mine"), TNOW, 0));
        times_are("after UTIME_NOW", "d/mine", TNOW);
        R("owner sets times again", utimensat(AT_FDCWD, P("d/mine"), T1, 0));
        snap("d/mine");
        R("owner UTIME_OMIT both", utimensat(AT_FDCWD, P("d/mine"), TOMIT, 0));
        times_are("after OMIT", "d/mine", TOMIT);
        moved("ctime after OMIT both", "d/mine");
        snap("d/mine");
        R("owner atime NOW mtime OMIT", utimensat(AT_FDCWD, P("d/mine"), TNOW_OMIT, 0));
        times_are("after NOW/OMIT", "d/mine", TNOW_OMIT);
        snap("d/mine");
        R("owner atime set mtime OMIT", utimensat(AT_FDCWD, P("d/mine"), TSET_OMIT, 0));
        times_are("after set/OMIT", "d/mine", TSET_OMIT);
        R("owner nanoseconds of 1e9", utimensat(AT_FDCWD, P("d/mine"), TBADNS, 0));
        R("owner negative nanoseconds", utimensat(AT_FDCWD, P("d/mine"), TNEGNS, 0));
        R("missing name, nanoseconds of 1e9", utimensat(AT_FDCWD, P("d/missing"), TBADNS, 0));
        R("owner NULL times", utimensat(AT_FDCWD, P("d/mine"), NULL, 0));
        times_are("after NULL", "d/mine", TNOW);
        R("non-owner without write: NOW", utimensat(AT_FDCWD, P("d/root644"), TNOW, 0));
        R("non-owner without write: NULL", utimensat(AT_FDCWD, P("d/root644"), NULL, 0));
        R("non-owner without write: set", utimensat(AT_FDCWD, P("d/root644"), T1, 0));
        R("non-owner without write: OMIT both", utimensat(AT_FDCWD, P("d/root644"), TOMIT, 0));
        R("non-owner with write: NOW", utimensat(AT_FDCWD, P("d/root666"), TNOW, 0));
        R("non-owner with write: NULL", utimensat(AT_FDCWD, P("d/root666"), NULL, 0));
        R("non-owner with write: set", utimensat(AT_FDCWD, P("d/root666"), T1, 0));
        R("non-owner with write: NOW/OMIT", utimensat(AT_FDCWD, P("d/root666"), TNOW_OMIT, 0));
        R("non-owner with write: NOW/set", utimensat(AT_FDCWD, P("d/root666"), TNOW_SET, 0));
        R("non-owner with group write: NOW", utimensat(AT_FDCWD, P("d/grp660"), TNOW, 0));
        R("non-owner with group write: set", utimensat(AT_FDCWD, P("d/grp660"), T1, 0));
        snap("d/link");
        R("owner sets the times of a symlink (NOFOLLOW)",
          utimensat(AT_FDCWD, P("d/link"), T1, AT_SYMLINK_NOFOLLOW));
        times_are("symlink after", "d/link", T1);
        int fd = open(P("d/root644"), O_RDONLY);
        R("futimens NOW on a read-only fd of root's 0644", futimens(fd, TNOW));
        close(fd);
        fd = open(P("d/root666"), O_WRONLY);
        R("futimens NOW on a write fd of root's 0666", futimens(fd, TNOW));
        R("futimens set on a write fd of root's 0666", futimens(fd, T1));
        close(fd);
        fd = open(P("d/mine"), O_RDONLY);
        snap("d/mine");
        R("futimens set on own file's read-only fd", futimens(fd, T1));
        times_are("after futimens", "d/mine", T1);
        close(fd);
    }
    AS(ROOT) {
        snap("d/mine");
        R("root sets times of u's file", utimensat(AT_FDCWD, P("d/mine"), T1, 0));
        times_are("after root's set", "d/mine", T1);
    }
}

static void sc_names(void) {
    begin("names");
    mkd("pub", 0777, 0, 0);
    mkf("pub/file", 0644, 0, 0);
    mkl("loop2", "pub/loop1");
    mkl("loop1", "pub/loop2");
    mkl("file", "pub/tofile");
    char long_name[300], ok_name[300];
    memset(long_name, 'n', 256);
    long_name[256] = 0;
    memset(ok_name, 'k', 255);
    ok_name[255] = 0;
    static char long_path[PATH_MAX + 64];
    size_t n = 0;
    while (n < PATH_MAX + 10) {
        memcpy(long_path + n, "aaaaaaa/", 8);
        n += 8;
    }
    long_path[n] = 0;
    static char long_target[PATH_MAX + 8];
    memset(long_target, 't', PATH_MAX);
    long_target[PATH_MAX] = 0;
    AS(U) {
        char rel[400];
        snprintf(rel, sizeof rel, "pub/%s", long_name);
        O("create with a 256-byte name", rel, O_CREAT | O_WRONLY, 0644);
        R("mkdir with a 256-byte name", mkdir(P(rel), 0755));
        R("symlink with a 256-byte name", symlink("x", P(rel)));
        ST("stat a 256-byte name", rel);
        R("unlink a 256-byte name", unlink(P(rel)));
        snprintf(rel, sizeof rel, "pub/%s", ok_name);
        O("create with a 255-byte name", rel, O_CREAT | O_WRONLY, 0644);
        ST("stat the 255-byte name", rel);
        char longer[320];
        snprintf(longer, sizeof longer, "pub/%s", long_name);
        R("rename to a 256-byte name", rename(P(rel), P(longer)));
        R("stat a path over PATH_MAX", access(long_path, F_OK));
        R("mkdir a path over PATH_MAX", mkdir(long_path, 0755));
        R("symlink with a target of PATH_MAX bytes", symlink(long_target, P("pub/longlink")));
        R("symlink with a target of PATH_MAX-1 bytes", symlink(long_target + 1, P("pub/longlink2")));
        ST("the PATH_MAX-1 target", "pub/longlink2");
        O("open through a file", "pub/file/x", O_RDONLY, 0);
        O("create through a file", "pub/file/x", O_CREAT | O_WRONLY, 0644);
        R("mkdir through a file", mkdir(P("pub/file/x"), 0755));
        R("unlink through a file", unlink(P("pub/file/x")));
        R("symlink through a file", symlink("x", P("pub/file/x")));
        R("chmod through a file", chmod(P("pub/file/x"), 0644));
        R("truncate through a file", truncate(P("pub/file/x"), 0));
        O("open a loop", "pub/loop1", O_RDONLY, 0);
        O("open through a loop", "pub/loop1/x", O_RDONLY, 0);
        R("mkdir through a loop", mkdir(P("pub/loop1/x"), 0755));
        R("chmod a loop", chmod(P("pub/loop1"), 0644));
        R("chown a loop", chown(P("pub/loop1"), -1, -1));
        R("truncate a loop", truncate(P("pub/loop1"), 0));
        R("unlink a loop (the link itself)", unlink(P("pub/loop2")));
        O("open through a symlink to a file with a slash", "pub/tofile/", O_RDONLY, 0);
        O("open a symlink to a file", "pub/tofile", O_RDONLY, 0);
        R("rmdir a symlink", rmdir(P("pub/tofile")));
        R("unlink a symlink", unlink(P("pub/tofile")));
        ST("its target stays", "pub/file");
        R("mkdir with a trailing slash", mkdir(P("pub/slash/"), 0755));
        R("rmdir with a trailing slash", rmdir(P("pub/slash/")));
        R("mkdir of an empty path", mkdir("", 0755));
        R("open an empty path", open("", O_RDONLY));
    }
    /* A chain of 41 symbolic links: more than the 40 the kernel follows. */
    char name[32], to[32];
    for (int i = 0; i <= 41; i++) {
        snprintf(name, sizeof name, "pub/c%d", i);
        snprintf(to, sizeof to, i == 41 ? "file" : "c%d", i + 1);
        mkl(to, name);
    }
    AS(U) {
        O("open at the end of 42 links", "pub/c0", O_RDONLY, 0);
        O("open at the end of 40 links", "pub/c2", O_RDONLY, 0);
    }
}

static void sc_mknod_root(void) {
    begin("nodes");
    AS(ROOT) {
        umask(0);
        R("mkfifo 0777 (umask 0)", mkfifo(P("p"), 0777));
        ST("fifo", "p");
        R("mknod chr 5,1", mknod(P("c"), S_IFCHR | 0640, makedev(5, 1)));
        ST("chr", "c");
        R("mknod over a fifo", mknod(P("p"), S_IFIFO | 0600, 0));
        R("mknod with a bad type", mknod(P("bad"), 0170000 | 0644, 0));
        R("mkdir 07777 (umask 0)", mkdir(P("d"), 07777));
        ST("dir 07777", "d");
        O("open O_CREAT 07777 (umask 0)", "f", O_CREAT | O_WRONLY, 07777);
        ST("file 07777", "f");
        snap("f");
        R("chmod 0 of a file", chmod(P("f"), 0));
        moved("chmod moves ctime only", "f");
        R("root chmod of a fifo", chmod(P("p"), 04755));
        ST("fifo after chmod 04755", "p");
    }
}

/* Root's setup: a FIFO or device node with the given bits and owner. */
static void mkn(const char *rel, mode_t mode, dev_t dev, uid_t u, gid_t g) {
    if (mknod(P(rel), mode & S_IFMT, dev) < 0 || chown(P(rel), u, g) < 0 || chmod(P(rel), mode & 07777) < 0) {
        out("setup", "node %s: %s", rel, strerrorname_np(errno));
        exit(3);
    }
}

/* FIFOs and device nodes opened by users: the kernel opens its pipe or
 * the driver, after checking the caller's credentials on the node. */
static void sc_special(void) {
    begin("special");
    mkd("pub", 0777, 0, 0);
    mkd("grp", 0750, 0, 65531);
    mkd("hidden", 0700, 0, 0);
    mkn("pub/f666", S_IFIFO | 0666, 0, 0, 0);
    mkn("grp/f660", S_IFIFO | 0660, 0, 0, 65531);
    mkn("hidden/f", S_IFIFO | 0666, 0, 0, 0);
    mkn("pub/null", S_IFCHR | 0666, makedev(1, 3), 0, 0);
    mkn("grp/null", S_IFCHR | 0660, makedev(1, 3), 0, 65531);
    mkn("pub/f600", S_IFIFO | 0600, 0, 0, 0);
    mkn("pub/null600", S_IFCHR | 0600, makedev(1, 3), 0, 0);
    AS(U) {
        O("fifo O_WRONLY|O_NONBLOCK without reader", "pub/f666", O_WRONLY | O_NONBLOCK, 0);
        O("fifo of a supplementary group O_RDONLY|O_NONBLOCK", "grp/f660", O_RDONLY | O_NONBLOCK, 0);
        O("fifo in a dir without search permission", "hidden/f", O_RDONLY | O_NONBLOCK, 0);
        int r = open(P("pub/f666"), O_RDONLY | O_NONBLOCK);
        R("fifo reader", r);
        int w = open(P("pub/f666"), O_WRONLY | O_NONBLOCK);
        R("fifo writer with the reader there", w);
        R("write to the fifo", write(w, "x", 1));
        char c = 0;
        R("read from the fifo", read(r, &c, 1));
        out("read back", "%c", c ? c : '-');
        close(w);
        close(r);
        O("0666 device O_WRONLY", "pub/null", O_WRONLY, 0);
        int d = open(P("grp/null"), O_RDWR);
        R("device of a supplementary group O_RDWR", d);
        R("write to the device", write(d, "x", 1));
        close(d);
        O("root's 0600 fifo", "pub/f600", O_RDONLY | O_NONBLOCK, 0);
        O("root's 0600 device", "pub/null600", O_WRONLY, 0);
    }
    AS(ROOT) {
        O("root opens the 0666 device", "pub/null", O_RDWR, 0);
        O("root fifo O_RDONLY|O_NONBLOCK", "grp/f660", O_RDONLY | O_NONBLOCK, 0);
    }
}

struct scenario {
    const char *name;
    void (*fn)(void);
};
static const struct scenario ALL[] = {
    {"chmod", sc_chmod},   {"chown", sc_chown},     {"setid_write", sc_setid_write},
    {"create", sc_create}, {"open", sc_open_access}, {"link", sc_link},
    {"sticky", sc_sticky}, {"rename", sc_rename},   {"remove", sc_rmdir_unlink},
    {"truncate", sc_truncate}, {"utimens", sc_utimens}, {"names", sc_names},
    {"nodes", sc_mknod_root}, {"special", sc_special},
};

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [SCENARIO...]\n", argv[0]);
        return 2;
    }
    base = argv[1];
    umask(022);
    for (unsigned i = 0; i < sizeof ALL / sizeof ALL[0]; i++) {
        int wanted = argc == 2;
        for (int a = 2; a < argc; a++)
            wanted |= strcmp(argv[a], ALL[i].name) == 0;
        if (wanted)
            ALL[i].fn();
    }
    return 0;
}
