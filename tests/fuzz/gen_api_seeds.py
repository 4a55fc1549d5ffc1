#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_api (tests/fuzz/corpus/fuzz_api/): short
call sequences in the target's encoding (tests/fuzz/fuzz_api.c: the opcode
table and the decoder; tests/fuzz/api_*.c: each operation's bytes), each a
scenario a person would write, so that fuzzing starts from meaningful
states. Run from the repository root; rewrites the seed-*.bin files."""
import os
import random

D = "tests/fuzz/corpus/fuzz_api"
(MALLOC, FREE, BAD, REC, HOLD, TPUSH, TPOP, SBEGIN, SEND, EMPTY, FRAC, RESET, FAIL, CONF, REP, INFO) = (
    0, 4, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20)
NAMES = {"weights": 0, "act": 1, "grad": 2, "optimizer": 3, "kv-cache": 4, "untagged": 5, "(none)": 6,
         "train": 7, "eval": 8, "load": 9}


def malloc(dev, kind, x, stream=0):
    return bytes([MALLOC, dev, kind]) + x.to_bytes(4, "big") + bytes([stream])


def free(i, how=0):
    return bytes([FREE, how, i])


def push(name):
    return bytes([TPUSH, NAMES[name]])


def begin(name):
    return bytes([SBEGIN, NAMES[name]])


def end():
    return bytes([SEND, 0])


seeds = {}
# a training step: load weights, train with activations, eval; reports
s = begin("load") + push("weights") + b"".join(malloc(d, 11, 4 << 20) for d in range(3)) + bytes([TPOP]) + end()
s += begin("train") + push("act")
s += b"".join(malloc(i % 3, 6 + i % 5, 1000 * i + 7, i % 3) for i in range(24))
s += bytes([TPOP]) + b"".join(free(i, i % 4) for i in range(0, 40, 3)) + end()
s += bytes([REP, 0, 0, REP, 1, 0, REP, 2, 1, REP, 3, 2, REP, 7, 0])
seeds["train-step"] = s
# out of memory: grow until the 96 MiB device is full, then empty the cache
s = b"".join(malloc(0, 12, 20 << 20) for _ in range(6)) + bytes([EMPTY, 0]) + malloc(0, 13, 60 << 20)
s += free(0) + free(0) + bytes([EMPTY, 13]) + malloc(0, 13, 90 << 20)
seeds["oom"] = s
# injected backend failures on every 2nd / 3rd call
s = bytes([FAIL, 2 | (2 << 3)]) + b"".join(malloc(i % 3, 6 + i % 7, 5000 * i) for i in range(20))
s += bytes([FAIL, 1 | (3 << 3)]) + b"".join(malloc(i % 3, 11, 1 << 20) for i in range(8)) + bytes([FAIL, 0])
seeds["faults"] = s
# streams: record on held streams, free, release, empty
s = malloc(1, 6, 4096, 1) + malloc(1, 9, 3 << 20, 2) + bytes([HOLD, 0 | 4, HOLD, 1 | 4])
s += bytes([REC, 0, 2, REC, 1, 3, REC, 0, 0]) + free(0) + free(0) + malloc(1, 6, 4096, 1)
s += bytes([HOLD, 0, HOLD, 1, EMPTY, 1])
seeds["streams"] = s
# bad input: double free, interior pointer, foreign pointer, NULL
s = malloc(2, 6, 100000) + malloc(2, 9, 2 << 20) + free(0)
s += bytes([BAD, 0, 0, 0, BAD, 1 | 8, 0, 3, BAD, 1 | 0x80, 0, 2, BAD, 2 | 16, 0, 0, BAD, 3 | 24, 0, 9, BAD, 4, 0, 0])
s += malloc(13, 6, 10) + malloc(14, 6, 10) + malloc(0, 15, 1) + malloc(0, 0, 0)
seeds["bad-pointers"] = s
# names: invalid tags and stages, stage misuse, deep stacks
s = bytes([TPUSH, 11, TPUSH, 12, TPUSH, 12 | 0x60, TPUSH, 12 | 0xb0, TPUSH, 10, 0x41, TPUSH, 10 | 0x20, 0x41, 0x0a, 0x42])
s += bytes([TPOP, TPOP, TPOP, SEND, 1, 7, SBEGIN, 7]) + bytes([SEND, 3, 8]) + end()
s += b"".join(push("act") for _ in range(66)) + b"".join(bytes([TPOP]) for _ in range(67))
s += b"".join(begin("eval") for _ in range(66)) + malloc(0, 6, 10)
seeds["names"] = s
# memory fraction, garbage collection, configure, resets
s = bytes([FRAC, 3, 0]) + b"".join(malloc(0, 11, 3 << 20) + free(0) for _ in range(10))
s += bytes([FRAC, 0, 1]) + malloc(1, 11, 1) + bytes([FRAC, 7, 0, FRAC, 8, 1, FRAC, 1, 14])
s += bytes([CONF, 0]) + begin("train") + malloc(2, 9, 5 << 20) + free(0) + end() + bytes([CONF, 13, CONF, 17])
s += bytes([RESET, 0, 0, RESET, 1, 1, RESET, 0, 13, CONF, 4]) + malloc(0, 6, 100) + bytes([REP, 7, 0, INFO, 1, 1, INFO, 2, 0])
seeds["fraction-config"] = s
rng = random.Random(11)
for k in range(6):
    seeds["random-%d" % k] = bytes(rng.randrange(256) for _ in range(rng.randrange(64, 1024)))
for name, data in seeds.items():
    with open(os.path.join(D, "seed-%s.bin" % name), "wb") as f:
        f.write(data)
print("wrote %d seeds to %s" % (len(seeds), D))
