"""`python -m tests.helpers.no_dac MODULE ARGS` (or `-c CODE ARGS`): the command without the capabilities
that let root read any file (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), so that a file's mode binds it as
it binds the file's owner: where the tests run as root, a file or folder chmod-ed to deny its owner
is denied to the command. Dropped by the process itself before the command runs, so that the command
can be forked (tests/helpers/forked.py) instead of starting an interpreter (~3 CPU s each); a torchrun
it starts runs fresh interpreters as its workers, which inherit the drop. Not `setpriv --reuid=65534`:
as another user, the command could not read the interpreter's own files where they lie under a folder
only root may enter (pyenv's under /root), and a forked command imports what it did not preload."""

from __future__ import annotations

import ctypes
import os
import sys

from tests.helpers.forked import become

CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
PR_CAPBSET_DROP = 24


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint32) for name in ("effective", "permitted", "inheritable")]


def drop_dac() -> None:
    """This process (its only thread, and whatever it starts or executes) without the two capabilities:
    capset binds the calling thread alone, so there must be no other yet (forked.become starts torch's
    threads after, for this module: review RV75d 4)."""
    threads = os.listdir("/proc/self/task")
    assert len(threads) == 1, f"no_dac: {len(threads)} threads before the drop; the others would keep it"
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):  # what an exec as root would be given again
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and os.geteuid() == 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
    header, data = _Header(_LINUX_CAPABILITY_VERSION_3, 0), (_Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    keep = ~((1 << CAP_DAC_OVERRIDE) | (1 << CAP_DAC_READ_SEARCH)) & 0xFFFFFFFF
    data[0].effective &= keep
    data[0].permitted &= keep
    data[0].inheritable &= keep
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


if __name__ == "__main__":
    drop_dac()
    # a torchrun's workers: fresh interpreters started from here, not forked by the worker server, which
    # keeps root's capabilities (review RV75d 4)
    os.environ["PYTHON_EXEC"] = sys.executable
    first, *args = sys.argv[1:]
    if first == "-c":  # `python -c CODE ARGS`: the code as __main__, sys.argv[0] "-c", as python gives it
        code, *args = args
        sys.argv = ["-c", *args]
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    else:
        become(first, args, dict(os.environ), os.getcwd())
