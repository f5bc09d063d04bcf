"""psagg.cli: the commands a pip install of psagg puts on PATH (pyproject.toml's
[project.scripts]): psagg-server, the server program the package carries (psagg/_bin), and the
launchers psagg-local, psagg-ssh and psagg-slurm (psagg.launch) and psagg-timeline
(psagg.timeline), the same code the checkout's deploy/ scripts run."""

import os
import sys

from . import launch


def server():
    """psagg-server: exec the psagg-server this package carries, with the same arguments."""
    path = launch.bundled("psagg-server")
    if path is None:
        sys.exit("psagg-server: this psagg package carries no psagg-server (%s/_bin): it was "
                 "not installed from a wheel; build it with CMake (README.md)" %
                 os.path.dirname(os.path.abspath(__file__)))
    os.execv(path, [path] + sys.argv[1:])


def local():
    """psagg-local (psagg.launch.LOCAL_DOC)."""
    sys.exit(launch.main("local"))


def ssh():
    """psagg-ssh (psagg.launch.SSH_DOC)."""
    sys.exit(launch.main("ssh"))


def slurm():
    """psagg-slurm (psagg.launch.SLURM_DOC)."""
    sys.exit(launch.main("slurm"))


def timeline():
    """psagg-timeline (psagg.timeline)."""
    from . import timeline as tl
    sys.exit(tl.main())
