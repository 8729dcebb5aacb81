"""A process's own peak resident memory (shared by the JAX and the PyTorch workers)."""

from __future__ import annotations

import resource
import sys


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB, its own only.

    Linux's ``ru_maxrss`` keeps the parent's high-water mark across ``fork`` and ``execve``: a
    worker started by a parent holding 1.7 GiB reported 1.7 GiB whatever it used. ``VmHWM`` in
    ``/proc/self/status`` belongs to the process's own address space, new at ``execve``.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    # elsewhere: ru_maxrss (KiB on Linux, bytes on macOS)
    scale = 2**20 if sys.platform == "darwin" else 2**10
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale
