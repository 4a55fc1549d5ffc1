"""tally.sleep, tally.wake, tally.asleep and tally.tag(name, private=True)
in this process, on the host backend (docs/sleep.md): the memory of a
private tag goes back and comes back at the same addresses, with its bytes
after an offload."""

import ctypes
import unittest

import tally

from . import CONF  # noqa: F401  (sets TALLY_CONF before tally starts)
from .support import run_python

lib = tally.library()


def tagged(tag, size):
    with tally.tag(tag, private=True):
        p = lib.tally_malloc(size, 0, None)
    assert p, tally._lib.last_error()
    return p


def reserved():
    return tally.memory_reserved(0)


class SleepTest(unittest.TestCase):
    def test_private_tag(self):
        t = tally.tag("py-private", private=True)
        self.assertEqual(repr(t), "tally.tag('py-private', private=True)")
        with t:
            pass
        self.assertEqual(lib.tally_tag_is_private(b"py-private"), 1)
        self.assertTrue(tally.sleep_info("py-private")["private"])
        self.assertFalse(tally.sleep_info("py-never")["private"])

    def test_offload_restores_the_bytes(self):
        p = tagged("py-weights", 8 << 20)
        pattern = bytes(range(256)) * ((8 << 20) // 256)
        ctypes.memmove(p, pattern, len(pattern))
        before = reserved()
        tally.sleep("py-weights", offload=True)
        info = tally.sleep_info("py-weights", 0)
        self.assertTrue(info["asleep"] and info["offloaded"])
        self.assertEqual(info["sleeping_bytes"], 8 << 20)
        self.assertEqual(info["offload_bytes"], 8 << 20)
        self.assertLess(reserved(), before)
        tally.wake("py-weights")
        self.assertEqual(reserved(), before)
        self.assertEqual(ctypes.string_at(p, len(pattern)), pattern)
        self.assertEqual(tally.sleep_info("py-weights")["offload_bytes"], 0)
        lib.tally_free(ctypes.c_void_p(p))

    def test_asleep_discards_and_wakes_on_exit(self):
        p = tagged("py-kv", 4 << 20)
        ctypes.memset(p, 0x41, 4 << 20)
        before = reserved()
        with self.assertRaises(RuntimeError):
            with tally.asleep("py-kv"):
                self.assertTrue(tally.sleep_info("py-kv")["asleep"])
                self.assertLess(reserved(), before)
                raise RuntimeError("inside")
        self.assertFalse(tally.sleep_info("py-kv")["asleep"])
        self.assertEqual(reserved(), before)
        self.assertEqual(ctypes.string_at(p, 16), b"\0" * 16)  # discarded
        lib.tally_free(ctypes.c_void_p(p))

    def test_report_and_snapshot_show_it(self):
        p = tagged("py-snap", 2 << 20)
        tally.sleep("py-snap")
        rows = [r for r in tally.report()["private_tags"] if r["tag"] == "py-snap" and r["device"] == 0]
        self.assertEqual(len(rows), 1)
        self.assertTrue(rows[0]["asleep"])
        self.assertEqual(rows[0]["sleeping_bytes"], 2 << 20)
        snap = tally.snapshot()["tally"]["private_tags"]
        self.assertTrue(any(r["tag"] == "py-snap" and r["asleep"] for r in snap))
        self.assertIn("private tags (sleep and wake)", tally.ledger_text())
        tally.wake("py-snap")
        lib.tally_free(ctypes.c_void_p(p))

    def test_errors(self):
        with tally.tag("py-shared"):
            p = lib.tally_malloc(4096, 0, None)
        with self.assertRaises(tally.TallyError) as e:
            tally.sleep("py-shared")
        self.assertIn("tag 'py-shared' is not private", str(e.exception))
        with self.assertRaises(TypeError):
            tally.sleep()
        with self.assertRaises(TypeError):
            tally.wake(3)
        lib.tally_free(ctypes.c_void_p(p))

    def test_private_tags_key_and_async(self):
        script = ("import tally, ctypes\n"
                  "lib = tally.library()\n"
                  "with tally.tag('kv'):\n"
                  "    p = lib.tally_malloc(1 << 20, 0, None)\n"
                  "tally.sleep('kv')\n"
                  "with tally.tag('kv'):\n"
                  "    q = lib.tally_malloc(4096, 0, None)\n"  # sleep_alloc:wake wakes it
                  "print('asleep', tally.sleep_info('kv')['asleep'], bool(q))\n")
        r = run_python(["-c", script], conf="backend:host,private_tags:kv,sleep_alloc:wake")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("asleep False True", r.stdout)
        self.assertIn("waking it for an allocation (sleep_alloc:wake)", r.stderr)


if __name__ == "__main__":
    unittest.main()
