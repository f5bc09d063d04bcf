"""setup.py - the native half of `pip install .` (pyproject.toml holds the metadata).

build_py first copies the Python package, then builds libpsagg and psagg-server with CMake
(Release, no tests; PSAGG_CUDA=AUTO|ON|OFF and PSAGG_CMAKE_ARGS from the environment pass
through) in build-pip/cmake, and copies them into the package: psagg/_lib/libpsagg.so.0, which
psagg finds by its own location, and psagg/_bin/psagg-server, which the psagg-server console
script runs. They link the system's libfabric, jemalloc (the server), inih, libsodium, libcrypto
and libmicrohttpd (docs/install.md), so the wheel is for the kind of host it was built on.
"""
import os
import shlex
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution
try:  # (setuptools >= 70.1 has its own; Debian 12's 66 has wheel's)
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))


class BinaryDistribution(Distribution):
    """A wheel with native code in it: not pure (platlib)."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """Tagged py3-none-<platform>: the native code is loaded with ctypes and run as a program,
    never imported as an extension, so any Python 3 on this platform can use the wheel."""

    def get_tag(self):
        return "py3", "none", super().get_tag()[2]


class BuildWithCMake(build_py):
    def run(self):
        # (a file an earlier build left in build-pip/lib, since removed from the source, must not
        # reach this wheel)
        shutil.rmtree(os.path.join(self.build_lib, "psagg"), ignore_errors=True)
        super().run()
        if self.dry_run:
            return
        tree = os.path.join(HERE, "build-pip", "cmake")
        cuda = os.environ.get("PSAGG_CUDA", "AUTO")
        configure = ["cmake", "-S", HERE, "-B", tree, "-DCMAKE_BUILD_TYPE=Release",
                     "-DBUILD_TESTING=OFF", "-DPSAGG_CUDA=" + cuda]
        configure += shlex.split(os.environ.get("PSAGG_CMAKE_ARGS", ""))
        jobs = str(os.cpu_count() or 1)
        for cmd in (configure,
                    ["cmake", "--build", tree, "--target", "psagg", "psagg-server", "-j", jobs]):
            self.announce("running " + " ".join(cmd), level=2)
            subprocess.check_call(cmd)
        pkg = os.path.join(self.build_lib, "psagg")
        for src, sub, name in ((os.path.join(tree, "worker", "libpsagg.so.0"), "_lib",
                                "libpsagg.so.0"),
                               (os.path.join(tree, "server", "psagg-server"), "_bin",
                                "psagg-server")):
            os.makedirs(os.path.join(pkg, sub), exist_ok=True)
            dst = os.path.join(pkg, sub, name)
            shutil.copyfile(os.path.realpath(src), dst)  # (the soname link's file)
            os.chmod(dst, 0o755)


setup(distclass=BinaryDistribution,
      cmdclass={"build_py": BuildWithCMake, "bdist_wheel": PlatformWheel},
      options={"build": {"build_base": "build-pip"}})
