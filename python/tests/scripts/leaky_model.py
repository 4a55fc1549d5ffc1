"""A program that calls tally through ctypes.CDLL (which releases the GIL
around each call, as PyTorch does around an op) from named functions, and
keeps what it should not. Used by python/tests/test_sites.py: the lines
marked "# line:NAME" are the ones the reports must name."""

import ctypes
import os
import sys

lib = ctypes.CDLL(os.environ["TALLY_LIB"])
lib.tally_malloc.restype = ctypes.c_void_p
lib.tally_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.tally_free.argtypes = [ctypes.c_void_p]
lib.tally_ignore.argtypes = [ctypes.c_void_p]

kept = []


def make_model(size):
    p = lib.tally_malloc(size, 0, None)  # line:make_model
    assert p
    return p


def load_checkpoint(size):
    p = lib.tally_malloc(size, 1, None)  # line:load_checkpoint
    assert p
    return p


def main(mode):
    if mode == "once":
        kept.append(make_model(4 << 20))  # line:main_once
    elif mode == "twice":
        first = make_model(4 << 20)  # line:main_first
        lib.tally_free(first)
        kept.append(make_model(4 << 20))  # line:main_second
        kept.append(load_checkpoint(1 << 20))  # line:main_checkpoint
    elif mode == "ignored":
        kept.append(make_model(4 << 20))
        lib.tally_ignore(kept[-1])
    elif mode == "loop":
        n = int(sys.argv[2])
        for _ in range(n):
            lib.tally_free(make_model(4096))
    elif mode == "same_line":
        for _ in range(3):
            kept.append(make_model(1 << 20))  # line:main_same_line


main(sys.argv[1])
