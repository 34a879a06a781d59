"""Run a module under cProfile of its main thread's CPU time, switched by signals: SIGUSR1 starts (or resumes)
it, SIGUSR2 pauses it and writes what it has so far to the file named first.

    python bench/profiled.py OUT -m MODULE [ARGS...]

CPU, not wall time: on a shared 2-core machine a server is often runnable but not running, and a wall-clock
profiler then blames whatever call it was preempted in (a socket write that woke its peer, most of all).
"""

from __future__ import annotations

import cProfile
import os
import runpy
import signal
import sys
import time
from typing import Any

if __name__ == "__main__":
    out, flag, module, *rest = sys.argv[1:]
    assert flag == "-m", __doc__
    profile = cProfile.Profile(time.thread_time)

    def start(*_: Any) -> None:
        profile.enable()

    def pause(*_: Any) -> None:
        profile.disable()
        profile.dump_stats(out)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, pause)
    sys.argv = [module, *rest]
    sys.path[0] = os.getcwd()  # where `python -m` looks first, not this script's folder
    runpy.run_module(module, run_name="__main__", alter_sys=True)
