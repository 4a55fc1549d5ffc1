/* Linked into every program of `make coverage` (with -Wl,--wrap=_exit):
 * a process that leaves through _exit, as tally's forked children and the
 * tests' helpers do, writes its line counts first; without it, what those
 * children ran would look never run. */
extern void __gcov_dump(void);
extern void __real__exit(int code) __attribute__((noreturn));
void __wrap__exit(int code) __attribute__((noreturn));

void __wrap__exit(int code)
{
    __gcov_dump();
    __real__exit(code);
}
