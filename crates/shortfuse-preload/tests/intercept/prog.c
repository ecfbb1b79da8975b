/* Interception checks, one per subcommand: prog CMD MOUNTPOINT [ARGS]. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;
static const char *mp;

static char *at(const char *rel) {
    /* Per thread: the workers build paths at the same time. */
    static __thread char bufs[8][512];
    static __thread int i;
    char *b = bufs[i++ % 8];
    snprintf(b, 512, "%s/%s", mp, rel);
    return b;
}

static void put(const char *rel, const char *data) {
    int fd = open(at(rel), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0 || write(fd, data, strlen(data)) != (ssize_t)strlen(data)) {
        printf("put %s failed: %s\n", rel, strerror(errno));
        exit(1);
    }
    close(fd);
}

static int cmp(const void *a, const void *b) { return strcmp(*(char **)a, *(char **)b); }

static void list(const char *rel) {
    DIR *d = opendir(at(rel));
    if (!d) {
        printf("opendir %s: %s\n", rel, strerror(errno));
        return;
    }
    char *names[64];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, n, sizeof *names, cmp);
    printf("ls %s:", rel);
    for (int i = 0; i < n; i++) printf(" %s", names[i]);
    printf("\n");
}

static int ops(void) {
    char buf[64];
    struct stat st;
    printf("mkdir %d\n", mkdir(at("dir"), 0755));
    int r = mkdir(at("dir"), 0755);
    printf("mkdir again %d %s\n", r, strerror(errno));
    int fd = open(at("dir/file"), O_CREAT | O_RDWR | O_TRUNC, 0644);
    printf("open %d\n", fd >= 0);
    printf("write %zd\n", write(fd, "abcdefghij", 10));
    printf("lseek %ld\n", (long)lseek(fd, 2, SEEK_SET));
    ssize_t n = read(fd, buf, 4);
    printf("read %zd %.*s\n", n, (int)n, buf);
    int fd2 = dup(fd);
    lseek(fd2, 1, SEEK_SET);
    printf("dup shares offset %ld\n", (long)lseek(fd, 0, SEEK_CUR));
    printf("pwrite %zd\n", pwrite(fd, "XY", 2, 8));
    fstat(fd, &st);
    printf("fstat %ld %o\n", (long)st.st_size, st.st_mode & 07777);
    close(fd2);
    close(fd);
    printf("rename %d\n", rename(at("dir/file"), at("dir/file2")));
    r = stat(at("dir/file"), &st);
    printf("stat old %d %s\n", r, strerror(errno));
    stat(at("dir/file2"), &st);
    printf("stat new %ld\n", (long)st.st_size);
    FILE *f = fopen(at("dir/file2"), "r");
    printf("fgets %s\n", fgets(buf, sizeof buf, f));
    fclose(f);
    put("dir/other", "x");
    list("dir");
    printf("chdir %d\n", chdir(at("dir")));
    printf("relative %d\n", access("file2", R_OK));
    printf("unlink %d\n", unlink("file2"));
    printf("unlink %d\n", unlink(at("dir/other")));
    chdir("/");
    printf("rmdir %d\n", rmdir(at("dir")));
    list(".");
    r = open(at("nope/x"), O_RDONLY);
    printf("open missing %d %s\n", r, strerror(errno));
    return 0;
}

/* A library loaded now issues raw system calls on the mount. */
static int dl(const char *lib) {
    put("secret", "only-in-the-mount");
    void *h = dlopen(lib, RTLD_NOW);
    if (!h) {
        printf("dlopen: %s\n", dlerror());
        return 1;
    }
    long (*rs)(long, long, long, long) = dlsym(h, "raw_syscall");
    unsigned char *site = dlsym(h, "raw_site");
    printf("site before %02x%02x\n", site[0], site[1]);
    for (int round = 0; round < 2; round++) {
        char buf[64] = {0};
        long fd = rs(SYS_openat, AT_FDCWD, (long)at("secret"), O_RDONLY);
        long n = fd < 0 ? fd : rs(SYS_read, fd, (long)buf, sizeof buf - 1);
        if (fd >= 0) rs(SYS_close, fd, 0, 0);
        printf("raw read %ld %s\n", n, buf);
        printf("site after %02x%02x\n", site[0], site[1]);
    }
    return 0;
}

static int wait_code(pid_t pid) {
    int st;
    if (waitpid(pid, &st, 0) != pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* posix_spawn (clone with CLONE_VM|CLONE_VFORK on a new stack), vfork,
 * fork; the parent's mount descriptor survives the child's close. */
static int spawn(void) {
    put("f", "data");
    int fd = open(at("f"), O_RDONLY);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addclose(&fa, fd);
    char *argv[] = {"sh", "-c", "exit 7", NULL};
    pid_t pid;
    int r = posix_spawn(&pid, "/bin/sh", &fa, NULL, argv, environ);
    printf("posix_spawn %d exit %d\n", r, r ? -1 : wait_code(pid));
    pid = vfork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", "exit 5", (char *)NULL);
        _exit(127);
    }
    printf("vfork exec exit %d\n", wait_code(pid));
    pid = vfork();
    if (pid == 0) _exit(3);
    printf("vfork _exit %d\n", wait_code(pid));
    printf("system %d\n", WEXITSTATUS(system("exit 4")));
    char buf[16] = {0};
    printf("parent read %zd %s\n", read(fd, buf, sizeof buf - 1), buf);
    pid = fork();
    if (pid == 0) {
        char b[8];
        _exit(pread(fd, b, 4, 0) == 4 && !memcmp(b, "data", 4) ? 9 : 1);
    }
    printf("fork child read exit %d\n", wait_code(pid));
    return 0;
}

static void *worker(void *arg) {
    long id = (long)arg;
    char name[32], want[64], got[64] = {0};
    snprintf(name, sizeof name, "t%ld", id);
    snprintf(want, sizeof want, "thread %ld was here", id);
    for (int i = 0; i < 50; i++) {
        put(name, want);
        int fd = open(at(name), O_RDONLY);
        ssize_t n = read(fd, got, sizeof got - 1);
        close(fd);
        if (n != (ssize_t)strlen(want) || memcmp(got, want, n)) return (void *)1;
    }
    return NULL;
}

static int threads(void) {
    pthread_t t[8];
    for (long i = 0; i < 8; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    int bad = 0;
    for (int i = 0; i < 8; i++) {
        void *r;
        pthread_join(t[i], &r);
        bad += r != NULL;
    }
    list(".");
    printf("threads bad %d\n", bad);
    return 0;
}

static volatile sig_atomic_t handled, bad_in_handler;
/* Built before the handler is installed: at() is not async-signal-safe. */
static char sig_path[512], main_path[512];

static void on_alarm(int sig) {
    (void)sig;
    int saved = errno;
    char buf[16] = {0};
    int fd = open(sig_path, O_RDONLY);
    ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
    if (fd >= 0) close(fd);
    if (n == 7 && !memcmp(buf, "sigdata", 7))
        handled++;
    else
        bad_in_handler++;
    errno = saved;
}

/* A signal handler doing file calls on the mount while the interrupted
 * thread keeps issuing file calls on it. */
static int signals(void) {
    put("sig", "sigdata");
    put("main", "maindata");
    snprintf(sig_path, sizeof sig_path, "%s", at("sig"));
    snprintf(main_path, sizeof main_path, "%s", at("main"));
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigfillset(&sa.sa_mask); /* SIGSYS must stay deliverable regardless */
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 200}, {0, 200}};
    setitimer(ITIMER_REAL, &it, NULL);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int bad = 0, loops = 0;
    do {
        struct stat st;
        char buf[16] = {0};
        if (stat(main_path, &st) || st.st_size != 8) bad++;
        int fd = open(main_path, O_RDONLY);
        if (read(fd, buf, sizeof buf - 1) != 8) bad++;
        close(fd);
        loops++;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 400000000L || handled < 20);
    struct itimerval off = {0};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("signals handled>=20 %d bad %d in handler %d\n", handled >= 20, bad, (int)bad_in_handler);
    return 0;
}

/* ymm0-15 across a served pread: the upper halves clean (the entry saves
 * the xmm registers and leaves the uppers zero and clean) and in use (it
 * saves the whole registers). 1 when both came back as they went in. */
static int ymm(int fd) {
    if (!__builtin_cpu_supports("avx")) return -1;
    unsigned char in[512], out[512], buf[16];
    for (int i = 0; i < 512; i++) in[i] = (unsigned char)(i * 5 + 3);
    int ok = 1;
    for (int used = 0; used < 2; used++) {
        long rax = SYS_pread64, rdi = fd, rsi = (long)buf, rdx = 16;
        register long r10 __asm__("r10") = 0;
        long inuse;
        if (used)
            __asm__ volatile("vmovdqu 0(%[in]), %%ymm0\n" "vmovdqu 32(%[in]), %%ymm1\n" "vmovdqu 64(%[in]), %%ymm2\n" "vmovdqu 96(%[in]), %%ymm3\n" "vmovdqu 128(%[in]), %%ymm4\n" "vmovdqu 160(%[in]), %%ymm5\n" "vmovdqu 192(%[in]), %%ymm6\n" "vmovdqu 224(%[in]), %%ymm7\n" "vmovdqu 256(%[in]), %%ymm8\n" "vmovdqu 288(%[in]), %%ymm9\n" "vmovdqu 320(%[in]), %%ymm10\n" "vmovdqu 352(%[in]), %%ymm11\n" "vmovdqu 384(%[in]), %%ymm12\n" "vmovdqu 416(%[in]), %%ymm13\n" "vmovdqu 448(%[in]), %%ymm14\n" "vmovdqu 480(%[in]), %%ymm15\n"
                             : : [in] "r"(in) : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
                               "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
        else
            __asm__ volatile("vzeroupper\n" "movdqu 0(%[in]), %%xmm0\n" "movdqu 32(%[in]), %%xmm1\n" "movdqu 64(%[in]), %%xmm2\n" "movdqu 96(%[in]), %%xmm3\n" "movdqu 128(%[in]), %%xmm4\n" "movdqu 160(%[in]), %%xmm5\n" "movdqu 192(%[in]), %%xmm6\n" "movdqu 224(%[in]), %%xmm7\n" "movdqu 256(%[in]), %%xmm8\n" "movdqu 288(%[in]), %%xmm9\n" "movdqu 320(%[in]), %%xmm10\n" "movdqu 352(%[in]), %%xmm11\n" "movdqu 384(%[in]), %%xmm12\n" "movdqu 416(%[in]), %%xmm13\n" "movdqu 448(%[in]), %%xmm14\n" "movdqu 480(%[in]), %%xmm15\n"
                             : : [in] "r"(in) : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
                               "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
        __asm__ volatile("syscall\n"
                         "mov %%rax, %%r8\n mov $1, %%ecx\n xgetbv\n mov %%rax, %[inuse]\n mov %%r8, %%rax\n" "vmovdqu %%ymm0, 0(%[out])\n" "vmovdqu %%ymm1, 32(%[out])\n" "vmovdqu %%ymm2, 64(%[out])\n" "vmovdqu %%ymm3, 96(%[out])\n" "vmovdqu %%ymm4, 128(%[out])\n" "vmovdqu %%ymm5, 160(%[out])\n" "vmovdqu %%ymm6, 192(%[out])\n" "vmovdqu %%ymm7, 224(%[out])\n" "vmovdqu %%ymm8, 256(%[out])\n" "vmovdqu %%ymm9, 288(%[out])\n" "vmovdqu %%ymm10, 320(%[out])\n" "vmovdqu %%ymm11, 352(%[out])\n" "vmovdqu %%ymm12, 384(%[out])\n" "vmovdqu %%ymm13, 416(%[out])\n" "vmovdqu %%ymm14, 448(%[out])\n" "vmovdqu %%ymm15, 480(%[out])\n"
                         : "+a"(rax), "+D"(rdi), "+S"(rsi), "+d"(rdx), "+r"(r10), [inuse] "=&r"(inuse)
                         : [out] "r"(out)
                         : "rcx", "r11", "r8", "r9", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6",
                           "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
        /* A clean upper state stays clean (XINUSE bit 2). */
        ok &= rax == 16 && (used || !(inuse & 4));
        for (int r = 0; r < 16; r++)
            for (int b = 0; b < 32; b++) ok &= out[32 * r + b] == (used || b < 16 ? in[32 * r + b] : 0);
    }
    return ok;
}

/* Vector and argument registers survive a served call. */
static int regs(void) {
    put("r", "0123456789abcdef");
    int fd = open(at("r"), O_RDONLY);
    unsigned char in[256], out[256], buf[16];
    for (int i = 0; i < 256; i++) in[i] = (unsigned char)(i * 7 + 1);
    register long r10 __asm__("r10") = 0;
    register long r8 __asm__("r8") = 0x1111;
    register long r9 __asm__("r9") = 0x2222;
    long rdi = fd, rsi = (long)buf, rdx = 16, rax = SYS_pread64;
    __asm__ volatile("movdqu 0(%[in]), %%xmm0\n movdqu 16(%[in]), %%xmm1\n movdqu 32(%[in]), %%xmm2\n"
                     "movdqu 48(%[in]), %%xmm3\n movdqu 64(%[in]), %%xmm4\n movdqu 80(%[in]), %%xmm5\n"
                     "movdqu 96(%[in]), %%xmm6\n movdqu 112(%[in]), %%xmm7\n movdqu 128(%[in]), %%xmm8\n"
                     "movdqu 144(%[in]), %%xmm9\n movdqu 160(%[in]), %%xmm10\n movdqu 176(%[in]), %%xmm11\n"
                     "movdqu 192(%[in]), %%xmm12\n movdqu 208(%[in]), %%xmm13\n movdqu 224(%[in]), %%xmm14\n"
                     "movdqu 240(%[in]), %%xmm15\n"
                     "syscall\n"
                     "movdqu %%xmm0, 0(%[out])\n movdqu %%xmm1, 16(%[out])\n movdqu %%xmm2, 32(%[out])\n"
                     "movdqu %%xmm3, 48(%[out])\n movdqu %%xmm4, 64(%[out])\n movdqu %%xmm5, 80(%[out])\n"
                     "movdqu %%xmm6, 96(%[out])\n movdqu %%xmm7, 112(%[out])\n movdqu %%xmm8, 128(%[out])\n"
                     "movdqu %%xmm9, 144(%[out])\n movdqu %%xmm10, 160(%[out])\n movdqu %%xmm11, 176(%[out])\n"
                     "movdqu %%xmm12, 192(%[out])\n movdqu %%xmm13, 208(%[out])\n movdqu %%xmm14, 224(%[out])\n"
                     "movdqu %%xmm15, 240(%[out])\n"
                     : "+a"(rax), "+D"(rdi), "+S"(rsi), "+d"(rdx), "+r"(r10), "+r"(r8), "+r"(r9)
                     : [in] "b"(in), [out] "r"(out)
                     : "rcx", "r11", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
                       "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
    /* Register variables hold only across asm operands: copy them first. */
    int kept = rdi == fd && rsi == (long)buf && rdx == 16 && r10 == 0 && r8 == 0x1111 && r9 == 0x2222;
    printf("pread %ld %.16s\n", rax, buf);
    printf("args kept %d\n", kept);
    printf("vector kept %d\n", !memcmp(in, out, sizeof in));
    printf("ymm kept %d\n", ymm(fd));
    return 0;
}

/* The number an open of `f` got, closed again. */
static int opened_and_closed(const char *f) {
    int fd = open(f, O_RDONLY);
    close(fd);
    return fd;
}

/* Descriptor numbers are the lowest free ones, as POSIX says, also when
 * the shim keeps a closed placeholder for the next open: each check
 * compares numbers, so the output is the same natively. The results are
 * printed at the end: a write in between would hand the number back. */
static int fds(void) {
    put("f", "x");
    const char *f = at("f");
    int r[32], n = 0, p[2];
    struct stat st;
    char link[64];
    /* reuse */
    int a = opened_and_closed(f);
    int b = open(f, O_RDONLY);
    r[n++] = b == a;
    close(b);
    /* a kernel descriptor made after a close gets the number */
    a = opened_and_closed(f);
    r[n++] = pipe(p) == 0 && p[0] == a;
    close(p[0]);
    close(p[1]);
    a = opened_and_closed(f);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    r[n++] = s == a;
    close(s);
    a = opened_and_closed(f);
    int k = open("/dev/null", O_RDONLY);
    r[n++] = k == a;
    close(k);
    /* two closed: the lower comes back first */
    a = open(f, O_RDONLY);
    b = open(f, O_RDONLY);
    close(a);
    close(b);
    int c = open(f, O_RDONLY), d = open(f, O_RDONLY);
    r[n++] = c == a && d == b;
    close(d);
    close(c);
    /* the same, closed the other way round */
    a = open(f, O_RDONLY);
    b = open(f, O_RDONLY);
    close(b);
    close(a);
    r[n++] = opened_and_closed(f) == a;
    /* a lower number freed in the kernel before the close */
    k = open("/dev/null", O_RDONLY);
    a = open(f, O_RDONLY);
    close(k);
    close(a);
    r[n++] = opened_and_closed(f) == k;
    /* a closed number is closed for the kernel too */
    a = opened_and_closed(f);
    r[n++] = fcntl(a, F_GETFD) == -1 && errno == EBADF;
    a = opened_and_closed(f);
    r[n++] = close(a) == -1 && errno == EBADF;
    a = opened_and_closed(f);
    r[n++] = fstat(a, &st) == -1 && errno == EBADF;
    a = opened_and_closed(f);
    snprintf(link, sizeof link, "/proc/self/fd/%d", a);
    r[n++] = access(link, F_OK) == -1 && errno == ENOENT;
    a = opened_and_closed(f);
    r[n++] = read(a, link, 1) == -1 && errno == EBADF;
    a = opened_and_closed(f);
    r[n++] = lseek(a, 0, SEEK_SET) == -1 && errno == EBADF;
    a = opened_and_closed(f);
    r[n++] = fstatat(a, "x", &st, 0) == -1 && errno == EBADF;
    a = opened_and_closed(f);
    r[n++] = openat(a, "x", O_RDONLY) == -1 && errno == EBADF;
    /* a stat of the mount and of the kernel between a close and the next
     * open or pipe */
    a = opened_and_closed(f);
    r[n++] = stat(f, &st) == 0 && opened_and_closed(f) == a;
    a = opened_and_closed(f);
    r[n++] = stat("/", &st) == 0 && pipe(p) == 0 && p[0] == a;
    close(p[0]);
    close(p[1]);
    /* dup2 onto a closed number; the next open takes the one above */
    a = opened_and_closed(f);
    r[n++] = dup2(1, a) == a;
    c = open(f, O_RDONLY);
    r[n++] = c == a + 1 && fcntl(a, F_GETFD) == 0;
    close(c);
    close(a);
    /* close-on-exec as each open asks */
    a = open(f, O_RDONLY | O_CLOEXEC);
    close(a);
    b = open(f, O_RDONLY);
    r[n++] = b == a && fcntl(b, F_GETFD) == 0;
    close(b);
    c = open(f, O_RDONLY | O_CLOEXEC);
    r[n++] = c == a && fcntl(c, F_GETFD) == FD_CLOEXEC;
    close(c);
    /* a child, and the parent after it, see the number free */
    a = opened_and_closed(f);
    pid_t pid = fork();
    if (pid == 0) _exit(open("/dev/null", O_RDONLY) == a ? 0 : 1);
    r[n++] = wait_code(pid) == 0;
    r[n++] = opened_and_closed(f) == a;
    printf("fds");
    for (int i = 0; i < n; i++) printf(" %d", r[i]);
    printf("\n");
    return unlink(f);
}

/* A `syscall` of the program's own text: its bytes before and after it
 * first runs (0f05 is syscall, ffd0 the call into the trampoline). */
extern unsigned char prog_site[];
__attribute__((noinline)) static long own_getpid(void) {
    long r = SYS_getpid;
    __asm__ volatile(".globl prog_site\nprog_site: syscall" : "+a"(r) : : "rcx", "r11", "memory");
    return r;
}

static int lazy(void) {
    printf("site before %02x%02x\n", prog_site[0], prog_site[1]);
    long pid = own_getpid();
    printf("getpid %d\n", pid == getpid());
    printf("site after %02x%02x\n", prog_site[0], prog_site[1]);
    return 0;
}

/* A second `syscall` of the program's own text. */
extern unsigned char prog_site2[];
__attribute__((noinline)) static long own_getppid(void) {
    long r = SYS_getppid;
    __asm__ volatile(".globl prog_site2\nprog_site2: syscall" : "+a"(r) : : "rcx", "r11", "memory");
    return r;
}

static void both_sites(const char *when) {
    printf("%s: a %02x%02x b %02x%02x\n", when, prog_site[0], prog_site[1], prog_site2[0], prog_site2[1]);
}

/* Runs site a, then site b, showing both before and between; the first
 * image then execs the second (`handed2`). */
static int handed(int second, const char *self) {
    both_sites(second ? "second" : "first");
    long pid = own_getpid();
    both_sites("after a");
    long ppid = own_getppid();
    printf("ids %d\n", pid == getpid() && ppid == getppid());
    if (second) return 0;
    char *args[] = {(char *)self, "handed2", (char *)mp, NULL};
    execv("/proc/self/exe", args);
    return 3;
}

/* Not a test: prints ns per getpid, for the report. */
static int bench(void) {
    struct timespec a, b;
    long n = 2000000;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) syscall(SYS_getpid);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
    int fd = open("/dev/null", O_WRONLY);
    n /= 4;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) write(fd, "", 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double wns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
    printf("getpid %.1f ns, write(/dev/null) %.1f ns\n", ns, wns);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    mp = argv[2];
    const char *c = argv[1];
    if (!strcmp(c, "ops")) return ops();
    if (!strcmp(c, "dlopen") && argc > 3) return dl(argv[3]);
    if (!strcmp(c, "spawn")) return spawn();
    if (!strcmp(c, "threads")) return threads();
    if (!strcmp(c, "signals")) return signals();
    if (!strcmp(c, "regs")) return regs();
    if (!strcmp(c, "fds")) return fds();
    if (!strcmp(c, "lazy")) return lazy();
    if (!strcmp(c, "handed")) return handed(0, argv[0]);
    if (!strcmp(c, "handed2")) return handed(1, argv[0]);
    if (!strcmp(c, "bench")) return bench();
    return 2;
}
