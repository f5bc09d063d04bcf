#!/usr/bin/env python3
"""check_names.py - psagg_ names the public API only; internals are psagg__ (lint.names).

Usage: check_names.py REPO

Every identifier psagg_x (one underscore) in the C and CUDA code of the repository's tracked
files (comments and strings aside) must be declared in a public header: worker/include/psagg.h
or common/include/psagg/types.h. Anything else is an internal and takes the prefix psagg__
(psagg.h, "Names"), as libuv's uv__ internals do. Each offending name is printed once with the
first file:line that uses it; exit 1 when there is one, 0 otherwise.
"""
import os
import re
import subprocess
import sys

PUBLIC = ("worker/include/psagg.h", "common/include/psagg/types.h")
C_EXT = (".c", ".h", ".cu", ".cuh")
IDENT = re.compile(r"\bpsagg_(?!_)\w*")


def code_only(text):
    """text with its comments, string and character literals blanked (lines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
        elif text[i] in "\"'":
            j = i + 1
            while j < n and text[j] != text[i] and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(" " * (j - i))
        else:
            j = i + 1
            out.append(text[i])
        i = j
    return "".join(out)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    repo = sys.argv[1]
    files = subprocess.run(["git", "-C", repo, "ls-files"], capture_output=True, text=True,
                           check=True).stdout.split()
    public = set()
    for p in PUBLIC:
        with open(os.path.join(repo, p), encoding="utf-8") as fh:
            public |= set(IDENT.findall(code_only(fh.read())))
    first = {}
    for f in sorted(f for f in files if f.endswith(C_EXT)):
        path = os.path.join(repo, f)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as fh:
            for no, line in enumerate(code_only(fh.read()).split("\n"), 1):
                for name in IDENT.findall(line):
                    if name not in public and name != "psagg_":
                        first.setdefault(name, "%s:%d" % (f, no))
    for name, where in sorted(first.items()):
        print("%s: %s is not declared in %s: an internal is psagg__%s" %
              (where, name, " or ".join(PUBLIC), name[len("psagg_"):]))
    if first:
        print("check_names: %d internal name(s) with the public prefix" % len(first))
        return 1
    print("check_names: every psagg_ name in the code is public (%d declared)" % len(public))
    return 0


if __name__ == "__main__":
    sys.exit(main())
