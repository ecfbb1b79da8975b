/* Loaded with dlopen after start-up: its `syscall` instruction was not
 * there for the start-up rewrite. raw_site names it, so the caller can see
 * whether Syscall User Dispatch rewrote it. */
__attribute__((noinline)) long raw_syscall(long nr, long a, long b, long c) {
    long r;
    __asm__ volatile(".globl raw_site\n"
                     "raw_site: syscall"
                     : "=a"(r)
                     : "a"(nr), "D"(a), "S"(b), "d"(c)
                     : "rcx", "r11", "memory");
    return r;
}
