"""Child processes that end with the process that started them, however it ends.

A test session killed with SIGKILL runs no ``finally`` and no finalizer: without help,
the redis-servers and ``scrapy crawl`` workers it started keep running. On Linux,
:func:`die_with_parent` asks the kernel to send them SIGKILL when their parent dies.
Its ``preexec_fn`` runs between fork and exec, where a threaded parent's locks may be
held: it only calls ``prctl`` (looked up before the fork), ``getppid`` and ``_exit``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["die_with_parent"]

#: ``prctl`` option: the signal the child gets when its parent thread exits.
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """Returns a ``preexec_fn`` for :class:`subprocess.Popen` under which the child gets
    SIGKILL when the calling process dies, or None where that cannot be promised.

    None off Linux, and off the main thread: Linux ties the signal to the thread that
    forked, so a child started from a thread would die when that thread ends.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the request took hold
            os._exit(1)

    return preexec
