#!/usr/bin/env python3
"""check_layers.py - psagg's layering rule, checked on the #include lines.

Usage: check_layers.py [REPO]          check the tree (default: this script's repository)
       check_layers.py --self-test     plant bad includes in a copy and expect each reported

The layers, bottom to top (README "Where things are"; docs/design.md "Layers"):

    base      common/include/ (installed psagg/types.h), common/base/
    kernels   kernels/
    runtime   common/runtime/
    server    server/            worker    worker/   (the two tops; neither includes the other)

A file may include its own layer and the layers below it. Installed headers
(common/include/, worker/include/) may include only installed headers. Every quoted include
must resolve the way the build resolves it: next to the including file, then in the include
folders common/include, common, the repository root and worker/include. Violations are printed
as "file:line: ..." and make the exit status 1; exit 0 when the tree is clean.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

LAYERS = {"base": 0, "kernels": 1, "runtime": 2, "server": 3, "worker": 3}
SOURCES = (".c", ".h", ".cu", ".cuh")
CHECKED = ("common", "kernels", "server", "worker")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def layer_of(rel):
    """The layer of a repository-relative path, or None for files outside the layers."""
    parts = rel.split("/")
    if parts[0] == "common" and len(parts) > 2 and parts[1] in ("include", "base"):
        return "base"
    if parts[0] == "common" and len(parts) > 2 and parts[1] == "runtime":
        return "runtime"
    if parts[0] in ("kernels", "server", "worker"):
        return parts[0]
    return None


def installed(rel):
    return rel.startswith("common/include/") or rel.startswith("worker/include/")


def resolve(repo, rel, name, quoted):
    """The repository file an include names, as the compiler would find it, or None."""
    roots = ["common/include", "common", ".", "worker/include"]
    candidates = ([os.path.dirname(rel)] if quoted else []) + roots
    for d in candidates:
        path = os.path.normpath(os.path.join(d, name))
        if not path.startswith("..") and os.path.isfile(os.path.join(repo, path)):
            return path.replace(os.sep, "/")
    return None


def check(repo):
    """Return the list of violations ("file:line: message") in repo."""
    problems = []
    for top in CHECKED:
        for dirpath, _, files in os.walk(os.path.join(repo, top)):
            for f in sorted(files):
                if not f.endswith(SOURCES):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), repo).replace(os.sep, "/")
                src_layer = layer_of(rel)
                if src_layer is None:
                    problems.append(f"{rel}:1: file belongs to no layer (common/ holds "
                                    "include/, base/ and runtime/)")
                    continue
                with open(os.path.join(repo, rel), encoding="utf-8", errors="replace") as fh:
                    for lineno, line in enumerate(fh, 1):
                        m = INCLUDE_RE.match(line)
                        if not m:
                            continue
                        quoted, name = m.group(1) == '"', m.group(2)
                        target = resolve(repo, rel, name, quoted)
                        if target is None:
                            if quoted:
                                problems.append(f"{rel}:{lineno}: #include \"{name}\" names no "
                                                "file of the tree (write the layer's folder: "
                                                "\"base/log.h\", \"runtime/config.h\", ...)")
                            continue  # <system header>
                        dst_layer = layer_of(target)
                        if dst_layer is None:
                            problems.append(f"{rel}:{lineno}: includes {target}, which belongs "
                                            "to no layer")
                            continue
                        if installed(rel) and not installed(target):
                            problems.append(f"{rel}:{lineno}: installed header includes {target}, "
                                            "which is not installed")
                        ok = dst_layer == src_layer or LAYERS[dst_layer] < LAYERS[src_layer]
                        if not ok:
                            problems.append(f"{rel}:{lineno}: {src_layer} includes {target} "
                                            f"({dst_layer}): a layer may include only itself and "
                                            "the layers below it (base < kernels < runtime < "
                                            "server, worker)")
    return problems


def self_test(repo):
    """Plant violations in a copy of the tree; each must be reported at its file:line."""
    plants = [  # (file, include line, what the report must contain)
        ("kernels/codec.c", '#include "runtime/layout.h"', "kernels includes common/runtime/layout.h"),
        ("common/base/log.c", '#include "worker/worker.h"', "base includes worker/worker.h"),
        ("common/runtime/config.c", '#include "server/server.h"', "runtime includes server/server.h"),
        ("server/control.c", '#include "../worker/worker.h"', "server includes worker/worker.h"),
        ("kernels/cpu/scalar.c", '#include "psagg.h"', "kernels includes worker/include/psagg.h"),
        ("worker/include/psagg.h", '#include "base/error.h"', "installed header includes"),
        ("kernels/codec.h", '#include "nosuch.h"', 'names no file of the tree'),
    ]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for top in CHECKED:
            shutil.copytree(os.path.join(repo, top), os.path.join(tmp, top),
                            ignore=shutil.ignore_patterns("build*"))
        clean = check(tmp)
        if clean:
            print("self-test: the unmodified copy already has violations:", *clean, sep="\n  ")
            return 1
        for rel, inc, want in plants:
            path = os.path.join(tmp, rel)
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            lineno = text.count("\n", 0, text.index("#include")) + 1
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text.replace("#include", inc + "\n#include", 1))
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), tmp],
                                  capture_output=True, text=True)
            expect = f"{rel}:{lineno}: "
            hit = [l for l in proc.stdout.splitlines() if l.startswith(expect) and want in l]
            if proc.returncode != 1 or not hit:
                print(f"self-test FAILED: planting {inc} in {rel}: exit {proc.returncode}, "
                      f"wanted a line starting '{expect}' containing '{want}'; got:\n{proc.stdout}")
                failures += 1
            else:
                print(f"self-test: planted {inc} in {rel}: reported as: {hit[0]}")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
    print("self-test:", "FAILED" if failures else f"all {len(plants)} planted violations reported")
    return 1 if failures else 0


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    repo_default = os.path.normpath(os.path.join(here, "..", ".."))
    if len(argv) > 1 and argv[1] == "--self-test":
        return self_test(argv[2] if len(argv) > 2 else repo_default)
    repo = argv[1] if len(argv) > 1 else repo_default
    problems = check(repo)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} violation(s) of the layering rule")
        return 1
    print("check_layers: every #include respects base < kernels < runtime < server, worker")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
