"""This process's memory and CPU time, for the benchmarks that run each fit in its own subprocess."""
from __future__ import annotations

import resource
import sys


def status_mb(field: str) -> float:
    """A field of /proc/self/status (VmRSS, VmHWM) in MiB; NaN where unavailable."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return float(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def maxrss_mb() -> float:
    """Peak resident set size so far in MiB (``ru_maxrss`` is in KiB on Linux, bytes on macOS)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 2**20 if sys.platform == "darwin" else r / 1024


def reset_peak() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0); False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def cpu_seconds() -> float:
    """User plus system CPU time of this process."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime
