#!/usr/bin/env python3
"""check_python_abi.py - the Python package's ctypes mirror of psagg.h agrees with C
(unit.python_abi).

Usage: check_python_abi.py DUMP PYTHON_DIR HEADER...

DUMP is python_abi_dump (the C layouts and values as JSON, compiled against the headers),
PYTHON_DIR the folder holding the psagg package (<build>/python), HEADER psagg.h and
psagg/types.h. Checked, each difference printed on a line of its own (exit 1):

  - the dump is complete: every struct field, enum member and #define'd constant the headers
    declare is in it (so a field added to psagg.h but to neither side below fails too);
  - every public struct psagg_<x_y> has a ctypes.Structure _<XY> in the package with the same
    size and the same fields in the same order at the same offsets with the same sizes;
  - psagg.STATUS_NAMES equals psagg_status (names and numbers), and every other public
    constant PSAGG_<NAME> is the package's <NAME> with the same value;
  - the package's table of C signatures binds exactly the PSAGG_API functions, each with the
    header's number of parameters, and loading the built libpsagg binds every one of them;
  - importing the package imports no torch (the ctypes layer works without it);
  - psagg.__version__ is libpsagg's psagg_version() and starts with psagg.h's MAJOR.MINOR.
"""
import ctypes
import json
import re
import subprocess
import sys

# public constants the package does not mirror, and why
NOT_MIRRORED = {
    "PSAGG_VERSION_MAJOR": "psagg.__version__ starts with it (checked below)",
    "PSAGG_VERSION_MINOR": "psagg.__version__ starts with it (checked below)",
}


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def parse_headers(paths):
    """(structs {name: [field]}, enums {name: [member]}, defines {name}, functions {name: nargs})
    declared in the headers."""
    structs, enums, defines, functions = {}, {}, set(), {}
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            text = strip_comments(fh.read())
        for m in re.finditer(r"#\s*define\s+(PSAGG_[A-Z0-9_]+)[ \t]+(\S[^\n]*)", text):
            if m.group(1) != "PSAGG_API":
                defines.add(m.group(1))
        body = "\n".join(l for l in text.split("\n") if not re.match(r"\s*#", l))
        for m in re.finditer(r"typedef\s+struct\s+(psagg_\w+)\s*\{(.*?)\}\s*\1\s*;", body, re.S):
            fields = []
            for decl in m.group(2).split(";"):
                decl = re.sub(r"\[[^\]]*\]", "", decl).strip()
                if decl:
                    fields.append(re.findall(r"\w+", decl)[-1])
            structs[m.group(1)] = fields
        for m in re.finditer(r"typedef\s+enum\s+(psagg_\w+)\s*\{(.*?)\}\s*\1\s*;", body, re.S):
            enums[m.group(1)] = [e.split("=")[0].strip() for e in m.group(2).split(",")
                                 if e.strip()]
        for m in re.finditer(r"\bPSAGG_API\b[^;{}()]*?\b(\w+)\s*\(([^)]*)\)([^;{]*)", body):
            if "PSAGG_DEPRECATED" in m.group(3):
                continue  # an alias kept for C callers; the package binds its new name
            params = m.group(2).strip()
            functions[m.group(1)] = 0 if params in ("", "void") else params.count(",") + 1
    return structs, enums, defines, functions


def class_name(struct):
    """psagg_tensor_desc -> _TensorDesc"""
    return "_" + "".join(w.capitalize() for w in struct[len("psagg_"):].split("_"))


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    dump_exe, pydir, headers = sys.argv[1], sys.argv[2], sys.argv[3:]
    c = json.loads(subprocess.run([dump_exe], check=True, capture_output=True,
                                  text=True).stdout)
    structs, enums, defines, functions = parse_headers(headers)
    problems = []

    # 1. the dump covers the headers
    for s, fields in sorted(structs.items()):
        got = [f[0] for f in c["structs"].get(s, {}).get("fields", [])]
        if got != fields:
            problems.append("python_abi_dump.c: struct %s lists fields %s, the header %s" %
                            (s, got, fields))
    for s in sorted(set(c["structs"]) - set(structs)):
        problems.append("python_abi_dump.c: struct %s is not in the headers" % s)
    members = {m for e in enums.values() for m in e} | defines
    dumped = set(c["constants"]) | set(c["statuses"])
    for m in sorted(members - dumped):
        problems.append("python_abi_dump.c: the headers declare %s, the dump lacks it" % m)
    if set(enums.get("psagg_status", [])) != set(c["statuses"]):
        problems.append("python_abi_dump.c: its statuses %s differ from psagg_status's %s" %
                        (sorted(c["statuses"]), sorted(enums.get("psagg_status", []))))

    # 2. the package, imported from the build tree without torch
    sys.path.insert(0, pydir)
    import psagg  # noqa: E402
    if "torch" in sys.modules:
        problems.append("importing psagg imported torch: the ctypes layer must not need it")

    for s in sorted(structs):
        layout = c["structs"].get(s)
        cls = getattr(psagg, class_name(s), None)
        if cls is None or not issubclass(cls, ctypes.Structure):
            problems.append("psagg.%s: no ctypes.Structure for C struct %s" %
                            (class_name(s), s))
            continue
        if layout is None:
            continue
        py = [(name, getattr(cls, name).offset, getattr(cls, name).size)
              for name, *_ in cls._fields_]
        want = [tuple(f) for f in layout["fields"]]
        for i in range(max(len(py), len(want))):
            a = py[i] if i < len(py) else None
            b = want[i] if i < len(want) else None
            if a != b:
                problems.append("psagg.%s field %d: Python (name, offset, size) %s, C %s %s" %
                                (class_name(s), i, a, s, b))
        if ctypes.sizeof(cls) != layout["size"]:
            problems.append("psagg.%s: sizeof %d, C sizeof(%s) %d" %
                            (class_name(s), ctypes.sizeof(cls), s, layout["size"]))

    want_status = {v: n for n, v in c["statuses"].items()}
    for v in sorted(set(want_status) | set(psagg.STATUS_NAMES)):
        if want_status.get(v) != psagg.STATUS_NAMES.get(v):
            problems.append("psagg.STATUS_NAMES[%d] is %s, C's psagg_status %d is %s" %
                            (v, psagg.STATUS_NAMES.get(v), v, want_status.get(v)))
    for name, v in sorted(c["constants"].items()):
        if name in NOT_MIRRORED:
            continue
        py = name[len("PSAGG_"):]
        if getattr(psagg, py, None) != v:
            problems.append("psagg.%s is %r, C's %s is %d" % (py, getattr(psagg, py, None),
                                                              name, v))

    sigs = getattr(psagg, "_SIGNATURES", {})
    for f in sorted(set(sigs) | set(functions)):
        if f not in functions:
            problems.append("psagg._SIGNATURES binds %s, which the headers do not declare "
                            "PSAGG_API" % f)
        elif f not in sigs:
            problems.append("psagg._SIGNATURES lacks %s (declared PSAGG_API)" % f)
        elif len(sigs[f][1]) != functions[f]:
            problems.append("psagg._SIGNATURES: %s takes %d arguments, the header %d" %
                            (f, len(sigs[f][1]), functions[f]))
    want = "%d.%d." % (c["constants"]["PSAGG_VERSION_MAJOR"], c["constants"]["PSAGG_VERSION_MINOR"])
    if not psagg.__version__.startswith(want):
        problems.append("psagg.__version__ is %s; psagg.h says %s*" % (psagg.__version__, want))
    if not problems:
        try:
            lib = psagg.library()  # binds every signature: each must be exported
            if lib.psagg_version().decode() != psagg.__version__:
                problems.append("libpsagg's psagg_version() is %s, psagg.__version__ %s" %
                                (lib.psagg_version().decode(), psagg.__version__))
        except (OSError, ImportError, AttributeError) as e:
            problems.append("psagg.library(): %s" % e)

    for p in problems:
        print(p)
    if problems:
        print("check_python_abi: %d difference(s)" % len(problems))
        return 1
    print("check_python_abi: %d structs, %d statuses, %d constants and %d functions agree" %
          (len(structs), len(c["statuses"]), len(c["constants"]), len(functions)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
