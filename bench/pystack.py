"""Cost of python_stack:8 per allocation, from a Python loop.

Calls tally_malloc / tally_free through ctypes.CDLL (which releases the GIL
around each call, as PyTorch does around an op, so each allocation takes the
GIL back to read its frames) 8 Python frames deep, with python_stack:0 and
python_stack:8, and prints a Markdown table: CPU ns per allocate+free pair
(median of 7 rounds) and the difference per allocation.
Usage: python3 bench/pystack.py <path to libtally.so> [--quick]
(--quick: 2,000 pairs, 3 rounds; make bench-quick)"""

import ctypes
import statistics
import sys
import time

PAIRS = 50000
ROUNDS = 7
DEPTH = 8


def main():
    global PAIRS, ROUNDS
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] != "--quick"):
        sys.exit("usage: python3 bench/pystack.py <path to libtally.so> [--quick]")
    if len(sys.argv) == 3:
        PAIRS, ROUNDS = 2000, 3
    lib = ctypes.CDLL(sys.argv[1])
    lib.tally_malloc.restype = ctypes.c_void_p
    lib.tally_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.tally_free.argtypes = [ctypes.c_void_p]
    lib.tally_configure.argtypes = [ctypes.c_char_p]
    lib.tally_last_error.restype = ctypes.c_char_p
    if lib.tally_configure(b"backend:host,host_mode:virtual,leak_report:off,stage_report:false"):
        sys.exit("pystack: " + lib.tally_last_error().decode())
    malloc, free = lib.tally_malloc, lib.tally_free

    def loop():
        rounds = []
        for _ in range(ROUNDS):
            t = time.thread_time_ns()
            for _ in range(PAIRS):
                free(malloc(4096, 0, None))
            rounds.append((time.thread_time_ns() - t) / PAIRS)
        return statistics.median(rounds)

    def deep(d):
        return deep(d - 1) if d > 1 else loop()

    print("| python_stack | CPU ns per allocate+free pair (ctypes call included) | cost per allocation |")
    print("|---|---:|---:|")
    base = None
    for n in (0, 8):
        if lib.tally_configure(b"python_stack:%d" % n):
            sys.exit("pystack: " + lib.tally_last_error().decode())
        ns = deep(DEPTH)
        cost = "-" if base is None else "%.0f ns" % (ns - base)
        base = ns if base is None else base
        print("| %d | %.0f | %s |" % (n, ns, cost))


if __name__ == "__main__":
    main()
