"""The fleet's allocator setting, observed in a real process through glibc's own accounting (``mallinfo2``):
with the threshold fixed, a mid-sized array is mapped on its own (given back when freed) even after a large one was
freed, where glibc's dynamic threshold would have risen and served it from a heap; a user's setting is kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import ctypes, sys
from otel_dra.allocator import fix_mmap_threshold

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
fixed = fix_mmap_threshold(256 << 10) if sys.argv[1] == "fix" else None
large = bytearray(8 << 20)  # mapped, then freed: a dynamic threshold rises to its size
del large
before = libc.mallinfo2().hblkhd
held = bytearray(600 << 10)
print(fixed, libc.mallinfo2().hblkhd - before >= 600 << 10)
"""


def mapped(how: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_")}
    out = subprocess.run([sys.executable, "-c", SCRIPT, how], env={**clean, **env}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None, reason="glibc")
def test_a_fixed_threshold_maps_mid_sized_arrays_after_a_large_one_was_freed_and_a_users_setting_wins():
    assert mapped("leave") == "None False"  # glibc's dynamic threshold rose to 8 MB: served from a heap
    assert mapped("fix") == "True True"
    assert mapped("fix", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=4194304") == "False False"
    assert mapped("fix", MALLOC_MMAP_THRESHOLD_="4194304") == "False False"
