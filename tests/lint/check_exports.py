#!/usr/bin/env python3
"""check_exports.py - libpsagg.so exports exactly the public API (lint.exports).

Usage: check_exports.py [--nm NM] LIBPSAGG.so HEADER...

The public API is the set of functions declared with PSAGG_API in the headers given
(worker/include/psagg.h and common/include/psagg/types.h). The exported set is what
`nm -D --defined-only` lists in the library: its functions (T, W, i) and its data (D, B, R, V,
G, S, u: a public header declares no variables, so any is an internal that leaked); version
nodes (A, "PSAGG_0") are not symbols. Each extra or missing name is printed on a line of its
own; exit 1 when the two sets differ, 0 when they are equal.
"""
import argparse
import re
import subprocess
import sys

# a declaration "PSAGG_API <return type> psagg_name(" anywhere in the file (over line breaks)
DECL_RE = re.compile(r"\bPSAGG_API\b([^;{}()]*?)\b([A-Za-z_]\w*)\s*\(")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def declared(headers):
    """{function name: header} of the PSAGG_API declarations."""
    out = {}
    for path in headers:
        with open(path, encoding="utf-8") as fh:
            text = strip_comments(fh.read())
        # without preprocessor lines: the macro's own definition is not a declaration
        body = "\n".join(l for l in text.split("\n") if not re.match(r"\s*#", l))
        for m in DECL_RE.finditer(body):
            out[m.group(2)] = path
    return out


def exported(nm, lib):
    """({function}, {data object}) that the library's dynamic symbol table defines."""
    res = subprocess.run([nm, "-D", "--defined-only", lib], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit("check_exports: %s -D --defined-only %s failed: %s" % (nm, lib, res.stderr))
    funcs, data = set(), set()
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        kind, name = parts[1], parts[2].split("@")[0]  # psagg_init@@PSAGG_0
        if kind in "TWi":
            funcs.add(name)
        elif kind != "A":
            data.add(name)
    return funcs, data


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nm", default="nm")
    ap.add_argument("lib")
    ap.add_argument("headers", nargs="+")
    args = ap.parse_args()

    api = declared(args.headers)
    if not api:
        sys.exit("check_exports: no PSAGG_API declaration in %s" % " ".join(args.headers))
    funcs, data = exported(args.nm, args.lib)
    problems = []
    for name in sorted(funcs - set(api)):
        problems.append("extra: %s is exported by %s but not declared PSAGG_API in the public "
                        "headers (an internal: keep it out of worker/libpsagg.map)" %
                        (name, args.lib))
    for name in sorted(data):
        problems.append("extra: data symbol %s is exported by %s (the public headers declare "
                        "no variables)" % (name, args.lib))
    for name in sorted(set(api) - funcs):
        problems.append("missing: %s is declared PSAGG_API in %s but %s does not export it "
                        "(add it to worker/libpsagg.map)" % (name, api[name], args.lib))
    for p in problems:
        print(p)
    if problems:
        print("check_exports: %d problem(s); the public API is %d functions" %
              (len(problems), len(api)))
        return 1
    print("check_exports: %s exports exactly the %d PSAGG_API functions" % (args.lib, len(api)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
