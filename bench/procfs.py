"""A Linux process's CPU seconds, read from /proc: the one reading behind every bench figure that charges CPU to a
process (`bench.serving`'s server and clients, `bench.serve_cpu`'s stack)."""
from __future__ import annotations

import os


def cpu_seconds(pid: int | str) -> float:
    """User + system CPU seconds the process has used so far, all its threads together; OSError if it is gone."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15
