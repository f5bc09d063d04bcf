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
folders common/include, common, the repository root and worker/include (the build's
per-layer folders, build/layers/<layer>/<layer> -> common/base, common/runtime, kernels, name
the same files; they also make a bad include fail to compile, which this check reports with
its reason, and for every layer at once). Violations are printed
as "file:line: ..." and make the exit status 1; exit 0 when the tree is clean.

Inside the two tops, the order of files that server/server.h and worker/worker.h declare in
their header comment ("Files, from the top down": one "name.c  what it does" a line) is
checked too: no file calls one above it in that list. The map is read from the header each
time, so a file added to it is checked with no change here. File B "calls" file A when B
  - names a function or variable that A defines with external linkage (a definition at file
    scope in A.c that is not static; every mention in B counts: a call, a function pointer,
    an address), or
  - includes A's private header (A.h beside A.c, such as server/arena.h for arena.c).
Names defined in more than one file of the folder are ignored (a static namesake elsewhere is
not a call). Every .c file directly in the folder must appear in its map, and every file the
map names must exist. A call against the order is reported at the line of B that makes it.
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


# The folders whose internal order is declared by a map at the top of a header.
ORDERED = (("server", "server/server.h"), ("worker", "worker/worker.h"))
MAP_START_RE = re.compile(r"Files, from the top down")
MAP_ENTRY_RE = re.compile(r"^\s*\*\s{2,}([A-Za-z0-9_]+\.c)\s+\S")
TOKEN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\S")
C_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "_Alignof", "alignof",
              "__attribute__", "_Static_assert", "static_assert", "__typeof__", "typeof"}


def read_map(repo, header):
    """The files of a header's map, top first, as [(name, line)]; [] when it has none."""
    entries, started = [], False
    with open(os.path.join(repo, header), encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if not started:
                started = bool(MAP_START_RE.search(line))
                continue
            if line.lstrip().startswith("*/"):
                break
            m = MAP_ENTRY_RE.match(line)
            if m:
                entries.append((m.group(1), lineno))
    return entries


def strip_c(text):
    """text with comments, string and character literals and preprocessor lines blanked
    (newlines kept, so offsets keep their line numbers)."""
    out, i, n = [], 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c == "#":  # a directive, with its continuation lines
            j = i
            while j < n and (text[j] != "\n" or text[j - 1] == "\\"):
                j += 1
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
            continue
        if c == "\n":
            at_line_start = True
        elif not c.isspace():
            at_line_start = False
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            out.append(c)
            i += 1
            continue
        out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
        i = j
    return "".join(out)


def tokens(code):
    """[(token, line)] of stripped C code."""
    result, line, pos = [], 1, 0
    for m in TOKEN_RE.finditer(code):
        line += code.count("\n", pos, m.start())
        pos = m.start()
        result.append((m.group(0), line))
    return result


def definitions(toks):
    """(external, every): the names a file defines at file scope with external linkage
    (functions and variables that are not static), and all it defines there, static too."""
    names, every, stmt, depth = set(), set(), [], 0
    i = 0
    while i < len(toks):
        t = toks[i][0]
        if depth == 0:
            if t == "{" and stmt and stmt[-1] == ")" and "=" not in stmt:
                # a function definition: the name before the first parenthesis that is not
                # an attribute's
                words = stmt
                k = 0
                while k < len(words):
                    if words[k] == "__attribute__":  # skip its ((...))
                        d, k = 0, k + 1
                        while k < len(words):
                            d += {"(": 1, ")": -1}.get(words[k], 0)
                            k += 1
                            if d == 0:
                                break
                        continue
                    if words[k] == "(" and k > 0 and re.match(r"[A-Za-z_]", words[k - 1]):
                        if words[k - 1] not in C_KEYWORDS:
                            every.add(words[k - 1])
                            if "static" not in words[:k]:
                                names.add(words[k - 1])
                        break
                    k += 1
                stmt = []
                depth = 1
                i += 1
                continue
            if t == "{":
                depth = 1  # a struct/enum/union body or an initializer: keep the statement
                stmt.append(t)
                i += 1
                continue
            if t == ";":
                if stmt and not {"extern", "typedef"} & set(stmt):
                    # a variable: the identifier before '=', '[' or the end
                    end = stmt.index("=") if "=" in stmt else len(stmt)
                    head = stmt[:end]
                    while head and head[-1] == "]":
                        head = head[:len(head) - 1 - head[::-1].index("[")]
                    if (head and "(" not in head and re.match(r"[A-Za-z_]", head[-1])
                            and head[0] not in ("struct", "union", "enum") or
                            (head and head[0] in ("struct", "union", "enum") and len(head) > 2
                             and "{" not in head and "(" not in head)):
                        every.add(head[-1])
                        if "static" not in stmt:
                            names.add(head[-1])
                stmt = []
                i += 1
                continue
            stmt.append(t)
        else:
            if t == "{":
                depth += 1
            elif t == "}":
                depth -= 1
                if depth == 0 and stmt:
                    stmt.append("}")
        i += 1
    return names, every


def check_order(repo):
    """Violations of the file order that server.h and worker.h declare (see the docstring)."""
    problems = []
    for folder, header in ORDERED:
        if not os.path.isfile(os.path.join(repo, header)):
            continue
        order = read_map(repo, header)
        if not order:
            problems.append(f"{header}:1: no file map (\"Files, from the top down\") found")
            continue
        rank = {name: i for i, (name, _) in enumerate(order)}
        present = sorted(f for f in os.listdir(os.path.join(repo, folder))
                         if f.endswith(".c") and os.path.isfile(os.path.join(repo, folder, f)))
        for name, lineno in order:
            if name not in present:
                problems.append(f"{header}:{lineno}: the file map names {folder}/{name}, "
                                "which does not exist")
        for name in present:
            if name not in rank:
                problems.append(f"{folder}/{name}:1: not in the file map of {header}")
        files = [n for n, _ in order if n in present]
        toks, defs, every = {}, {}, {}
        for name in files:
            with open(os.path.join(repo, folder, name), encoding="utf-8",
                      errors="replace") as fh:
                toks[name] = tokens(strip_c(fh.read()))
            defs[name], every[name] = definitions(toks[name])
        owner, seen = {}, set()  # name -> the one file that defines it
        for name in files:
            for d in every[name]:
                if d in seen:
                    owner.pop(d, None)
                elif d in defs[name]:
                    owner[d] = name
                seen.add(d)
        for b in files:
            reported = set()
            for i, (t, lineno) in enumerate(toks[b]):
                a = owner.get(t)
                if a is None or a == b or rank[a] >= rank[b] or (t, a) in reported:
                    continue
                if i > 0 and toks[b][i - 1][0] in (".", ">"):  # a member: s.name, p->name
                    continue
                reported.add((t, a))
                problems.append(f"{folder}/{b}:{lineno}: calls {t} of {folder}/{a}, which is "
                                f"above it in the file map of {header} (no file calls one "
                                "above it)")
            with open(os.path.join(repo, folder, b), encoding="utf-8", errors="replace") as fh:
                for lineno, line in enumerate(fh, 1):
                    m = INCLUDE_RE.match(line)
                    if not m or m.group(1) != '"':
                        continue
                    inc = os.path.normpath(os.path.join(folder, m.group(2))).replace(os.sep, "/")
                    stem = os.path.basename(inc)[:-2] + ".c" if inc.endswith(".h") else None
                    if (stem and os.path.dirname(inc) == folder and inc != header
                            and stem in rank and stem != b and rank[stem] < rank[b]):
                        problems.append(f"{folder}/{b}:{lineno}: includes {inc}, the header of "
                                        f"{folder}/{stem}, which is above it in the file map "
                                        f"of {header} (no file calls one above it)")
    return problems


def check_all(repo):
    """Both rules: the layers (check) and the order inside server/ and worker/ (check_order)."""
    return check(repo) + check_order(repo)


def self_test(repo):
    """Plant violations in a copy of the tree; each must be reported at its file:line."""
    # (file, text, where, what the report must contain): "include" puts the text on a line of
    # its own before the file's first #include, "end" appends it as the file's last line,
    # "new" makes the file with the text as its only line.
    plants = [
        ("kernels/codec.c", '#include "runtime/layout.h"', "include",
         "kernels includes common/runtime/layout.h"),
        ("common/base/log.c", '#include "worker/worker.h"', "include",
         "base includes worker/worker.h"),
        ("common/runtime/config.c", '#include "server/server.h"', "include",
         "runtime includes server/server.h"),
        ("server/control.c", '#include "../worker/worker.h"', "include",
         "server includes worker/worker.h"),
        ("kernels/cpu/scalar.c", '#include "psagg.h"', "include",
         "kernels includes worker/include/psagg.h"),
        ("worker/include/psagg.h", '#include "base/error.h"', "include",
         "installed header includes"),
        ("kernels/codec.h", '#include "nosuch.h"', "include", "names no file of the tree"),
        # the order inside server/ and worker/ (server.h's and worker.h's file maps)
        ("server/metrics.c", "static void lint_planted(void) { server_run(0, 0); }", "end",
         "calls server_run of server/server.c, which is above it"),
        ("server/job.c", "static void *lint_planted = (void *)&agg_enqueue;", "end",
         "calls agg_enqueue of server/aggregate.c, which is above it"),
        ("server/metrics.c", '#include "arena.h"', "include",
         "includes server/arena.h, the header of server/arena.c, which is above it"),
        ("worker/handle.c", "static void lint_planted(void) { comm_stop(0); }", "end",
         "calls comm_stop of worker/comm.c, which is above it"),
        ("worker/planted.c", "int lint_planted;", "new", "not in the file map of worker/worker.h"),
    ]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for top in CHECKED:
            shutil.copytree(os.path.join(repo, top), os.path.join(tmp, top),
                            ignore=shutil.ignore_patterns("build*"))
        clean = check_all(tmp)
        if clean:
            print("self-test: the unmodified copy already has violations:", *clean, sep="\n  ")
            return 1
        for rel, plant, where, want in plants:
            path = os.path.join(tmp, rel)
            text = None
            if where == "new":
                lineno, planted = 1, plant + "\n"
            else:
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
                if where == "include":
                    lineno = text.count("\n", 0, text.index("#include")) + 1
                    planted = text.replace("#include", plant + "\n#include", 1)
                else:
                    text_nl = text if text.endswith("\n") else text + "\n"
                    lineno = text_nl.count("\n") + 1
                    planted = text_nl + plant + "\n"
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(planted)
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), tmp],
                                  capture_output=True, text=True)
            expect = f"{rel}:{lineno}: "
            hit = [l for l in proc.stdout.splitlines() if l.startswith(expect) and want in l]
            if proc.returncode != 1 or not hit:
                print(f"self-test FAILED: planting {plant} in {rel}: exit {proc.returncode}, "
                      f"wanted a line starting '{expect}' containing '{want}'; got:\n{proc.stdout}")
                failures += 1
            else:
                print(f"self-test: planted {plant} in {rel}: reported as: {hit[0]}")
            if text is None:
                os.remove(path)
            else:
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
    problems = check_all(repo)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} violation(s) of the layering rule")
        return 1
    print("check_layers: every #include respects base < kernels < runtime < server, worker; "
          "no file of server/ or worker/ calls one above it in its folder's file map")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
