#!/usr/bin/env python3
"""check_docs.py - psagg's documentation checks: links resolve, quick-start commands and the paths
code names exist.

Usage: check_docs.py [--build-dir DIR] [REPO]   check REPO (default: this script's repository)
       check_docs.py --self-test [--build-dir DIR] [REPO]
                                               plant faults in a copy and expect each reported

The documents checked are README.md and every docs/**/*.md.

Links. Every Markdown link and image, inline `[text](target)` or a reference definition
`[name]: target`, outside code (fenced blocks and `inline code`), whose target has no URL
scheme (http:, https:, mailto:, ...) must name a file or folder that exists in the repository,
relative to the document. A target with `#anchor` into a .md file (or `#anchor` alone: this
document) must name one of that file's headings, by GitHub's anchor rule: the heading's text
without Markdown markup, lower-cased, every character that is not a letter, digit, space,
hyphen or underscore dropped, spaces turned into hyphens; a repeated heading gets -1, -2, ...

Quick start. README.md must have a heading whose text is "Quick start" (any level). Its
section runs to the next heading of the same or a higher level, and every fenced code block in
it whose info string is sh, bash, shell or console is a list of commands (one per line;
`\\` continues a line, `#` starts a comment, heredoc bodies are skipped). Each line is cut into
commands at `&&`, `||`, `;`, `|` and `$( )`. In each command, leading VAR=value assignments and
the wrappers env, sudo, exec and time are skipped; the next word is the program, and so is the
word after a `--` (the launchers' `-- PROGRAM ARGS`). A program that is a path must exist and
be executable; a bare name must be found on PATH (shell builtins excepted). The script an
interpreter runs (python3 SCRIPT, bash SCRIPT) and every other word that is a path into the
tree (its first component is `build` or a top-level entry of the repository) must exist.
`build/...` names the build directory: --build-dir (ctest passes ${CMAKE_BINARY_DIR}),
default REPO/build. Words holding `$`, `*`, `?` or `~` are not checked.

Paths in code. In README.md and docs/, every word of code (an `inline code` span, or a line of a
fenced block) that is a path into one of the repository's own folders (TREE_FOLDERS: its first
component deploy, tests, conf, ...; the build folders are not checked) must exist: a command
line in the results or a how-to that names a script that moved or went is reported. Words
holding `$`, `*`, `?`, `~`, `<`, `>`, `{` or `[` are not checked.

Size and wording. README.md has at most README_MAX_LINES lines (a newcomer reads it in ten
minutes; the detail lives in docs/), and no document cites an issue by number (the word
"issue" and a number, with or without '#'): say what changed, in words. Nor does the code:
every source, script, build file and config under the repository's own folders
(CODE_SUFFIXES, and the extensionless scripts of deploy/), comments and messages included.

Wire facts. Every "protocol version N" in a document must be the version the code speaks,
PSAGG_PROTO_VERSION in common/runtime/wire.h (a page that describes the protocol must not go
stale when it changes; name an older one as "protocol N", without "version"). And
docs/design.md's table of messages names every control frame and data message type wire.h
defines (PSAGG_CTL_X and PSAGG_MSG_X: the word X).

Code facts. A file a comment of the C code names (a word like "state.c", "runtime/gate.h",
"psagg.h") must exist: somewhere in the tree by its name, or among the system's headers
(/usr/include, CUDA's); a file renamed or removed leaves no comment pointing at it. And the
list of structs that grow in psagg.h ("Structs that grow. Every public struct ... (A, B, ...)")
names exactly the public structs that start with `size_t struct_size`.

The feature table. docs/features.md holds, between "<!-- psagg-server --features -->" and
"<!-- end psagg-server --features -->", exactly what `psagg-server --features` prints (the
build's server: --build-dir/server/psagg-server), the table the config check reads.

Problems are printed as "file:line: what is wrong" and make the exit status 1; exit 0 when
everything checks out.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import unicodedata

README_MAX_LINES = 250
ISSUE_RE = re.compile(r"\bissues? #?[0-9]+\b", re.IGNORECASE)
SHELL_BLOCKS = ("sh", "bash", "shell", "console")
BUILTINS = {"cd", "export", "echo", "set", "source", ".", "true", "false", "test", "[",
            "read", "unset", "exit", "wait", "trap", "printf", "pwd"}
WRAPPERS = {"env", "sudo", "exec", "time", "nohup"}
INTERPRETERS = re.compile(r"^(python[0-9.]*|bash|sh|perl)$")
ASSIGN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
FENCE_RE = re.compile(r"^\s*(```+|~~~+)\s*([^`\s]*)")
HEADING_RE = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_LINK_RE = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF_RE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)")
CODE_SPAN_RE = re.compile(r"(`+)(.+?)\1")
SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def documents(repo):
    """README.md and docs/**/*.md, as repository-relative paths."""
    docs = ["README.md"] if os.path.isfile(os.path.join(repo, "README.md")) else []
    for dirpath, dirs, files in os.walk(os.path.join(repo, "docs")):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(".md"):
                docs.append(os.path.relpath(os.path.join(dirpath, f), repo).replace(os.sep, "/"))
    return docs


def lines_outside_fences(text):
    """(line number, line) for every line not inside a fenced code block."""
    fence = None
    for lineno, line in enumerate(text.split("\n"), 1):
        m = FENCE_RE.match(line)
        if m and (fence is None or m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)):
            fence = m.group(1) if fence is None else None
            continue
        if fence is None:
            yield lineno, line


def anchor_of(heading):
    """GitHub's anchor for a heading's text (see the module's docstring)."""
    text = CODE_SPAN_RE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)      # links: their text
    text = re.sub(r"<[^>]+>", "", text)                          # inline HTML
    text = text.replace("*", "")
    keep = []
    for c in text.lower():
        if c.isalnum() or c in " -_" or unicodedata.category(c).startswith("M"):
            keep.append(c)
    return "".join(keep).replace(" ", "-")


def anchors(path):
    """Every heading anchor of a Markdown file, duplicates numbered as GitHub numbers them."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    seen, out = {}, set()
    for _, line in lines_outside_fences(text):
        m = HEADING_RE.match(line)
        if not m:
            continue
        a = anchor_of(m.group(2))
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else f"{a}-{n}")
    return out


def check_links(repo, rel):
    """Problems with the relative links of one document."""
    problems = []
    path = os.path.join(repo, rel)
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    for lineno, line in lines_outside_fences(text):
        bare = CODE_SPAN_RE.sub(lambda m: " " * len(m.group(0)), line)
        targets = [m.group(2).strip("<>") for m in INLINE_LINK_RE.finditer(bare)]
        m = REF_DEF_RE.match(bare)
        if m:
            targets.append(m.group(1).strip("<>"))
        for target in targets:
            if SCHEME_RE.match(target) or target.startswith("//"):
                continue
            file_part, _, anchor = target.partition("#")
            if file_part:
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
                inside = os.path.commonpath([os.path.abspath(repo), os.path.abspath(dest)])
                if inside != os.path.abspath(repo):
                    problems.append(f"{rel}:{lineno}: link '{target}' leaves the repository")
                    continue
                if not os.path.exists(dest):
                    problems.append(f"{rel}:{lineno}: link '{target}': no such file "
                                    f"({os.path.relpath(dest, repo)})")
                    continue
            else:
                dest = path
            if anchor and dest.endswith(".md") and os.path.isfile(dest):
                have = anchors(dest)
                if anchor not in have:
                    close = sorted(a for a in have if a[:6] == anchor[:6])[:3]
                    hint = f"; similar: {', '.join('#' + a for a in close)}" if close else ""
                    problems.append(f"{rel}:{lineno}: link '{target}': "
                                    f"{os.path.relpath(dest, repo)} has no heading with the "
                                    f"anchor '#{anchor}'{hint}")
    return problems


def quick_start_blocks(text):
    """[(first line number, [lines])] of the shell blocks of README's "Quick start" section,
    or None when there is no such section."""
    lines = text.split("\n")
    start, level = None, None
    fence = None
    for i, line in enumerate(lines):
        m = FENCE_RE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            continue
        if fence is not None:
            continue
        h = HEADING_RE.match(line)
        if h and start is None and h.group(2).strip().lower() == "quick start":
            start, level = i, len(h.group(1))
        elif h and start is not None and len(h.group(1)) <= level:
            lines = lines[:i]
            break
    if start is None:
        return None
    blocks, cur, fence, lang = [], None, None, ""
    for i in range(start + 1, len(lines)):
        m = FENCE_RE.match(lines[i])
        if m and fence is None:
            fence, lang = m.group(1), m.group(2).lower()
            cur = (i + 2, []) if lang in SHELL_BLOCKS else None
            continue
        if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
            if cur is not None:
                blocks.append(cur)
            fence, cur = None, None
            continue
        if cur is not None:
            cur[1].append(lines[i])
    return blocks


def logical_lines(first, lines):
    """(line number, command text) with continuations joined and heredoc bodies skipped."""
    out, buf, buf_line, heredoc = [], "", None, None
    for k, line in enumerate(lines):
        lineno = first + k
        if heredoc is not None:
            if line.strip() == heredoc:
                heredoc = None
            continue
        if buf_line is None:
            buf_line = lineno
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        m = re.search(r"<<-?\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)['\"]?", buf)
        if m:
            heredoc = m.group(1)
            buf = buf[:m.start()]
        if buf.strip():
            out.append((buf_line, buf))
        buf, buf_line = "", None
    return out


def split_commands(line):
    """The simple commands of a shell line, each a list of words (comments dropped)."""
    inner = []
    # $( ... ) holds a command of its own; the outer word becomes a placeholder
    def take(m):
        inner.append(m.group(1))
        return " $SUBST "
    line = re.sub(r"\$\(([^()]*)\)", take, line)
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    lex.commenters = "#"
    cmds, cur = [], []
    try:
        for tok in lex:
            if tok and set(tok) <= set(";&|"):
                cmds.append(cur)
                cur = []
            else:
                cur.append(tok)
    except ValueError as e:
        return None, str(e)
    cmds.append(cur)
    for text in inner:
        sub, err = split_commands(text)
        if sub is None:
            return None, err
        cmds.extend(sub)
    return [c for c in cmds if c], None


def looks_like_tree_path(word, repo):
    if word.startswith("-") or any(c in word for c in "$*?~") or "/" not in word:
        return False
    if SCHEME_RE.match(word):
        return False
    first = word.split("/", 1)[0]
    return first == "build" or (first and os.path.exists(os.path.join(repo, first)))


def resolve_word(word, repo, build_dir):
    if word.startswith("build/"):
        return os.path.join(build_dir, word[len("build/"):])
    if os.path.isabs(word):
        return word
    return os.path.join(repo, word)


def installed_scripts(repo):
    """The commands `pip install .` puts on PATH (pyproject.toml's [project.scripts]): the quick
    start installs them before it runs them."""
    try:
        with open(os.path.join(repo, "pyproject.toml"), encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return set()
    m = re.search(r"^\[project\.scripts\]\n(.*?)(?:^\[|\Z)", text, re.S | re.M)
    return set(re.findall(r"^([A-Za-z0-9_.-]+)\s*=", m.group(1), re.M)) if m else set()


def check_command(words, repo, build_dir, where):
    """Problems with one simple command of the quick start."""
    problems = []
    i = 0
    while i < len(words) and ASSIGN_RE.match(words[i]):
        i += 1
    programs = set()
    scripts = set()
    while i < len(words) and os.path.basename(words[i]) in WRAPPERS:
        i += 1
        while i < len(words) and (ASSIGN_RE.match(words[i]) or words[i].startswith("-")):
            i += 1
    if i < len(words):
        programs.add(i)
    for k, w in enumerate(words):
        if w == "--" and k + 1 < len(words):
            programs.add(k + 1)
    for k in sorted(programs):
        name = os.path.basename(words[k])
        if INTERPRETERS.match(name):
            j = k + 1
            while j < len(words) and words[j].startswith("-") and words[j] not in ("-m", "-c"):
                j += 1
            # (python3 -m MODULE, -c CODE: no script)
            if j < len(words) and words[j] not in ("--", "-m", "-c"):
                scripts.add(j)
    for k, w in enumerate(words):
        if any(c in w for c in "$*?~"):
            continue
        if k in programs:
            if "/" not in w:
                if w not in BUILTINS and w not in installed_scripts(repo) and shutil.which(w) is None:
                    problems.append(f"{where}: program '{w}' is not on PATH")
                continue
            path = resolve_word(w, repo, build_dir)
            if not os.path.isfile(path):
                problems.append(f"{where}: program '{w}' does not exist ({path})")
            elif not (os.access(path, os.X_OK) and os.stat(path).st_mode & 0o111):
                problems.append(f"{where}: program '{w}' is not executable ({path})")
        elif k in scripts or looks_like_tree_path(w, repo):
            path = resolve_word(w, repo, build_dir)
            if not os.path.exists(path):
                what = "script" if k in scripts else "file"
                problems.append(f"{where}: {what} '{w}' does not exist ({path})")
    return problems


def check_quick_start(repo, build_dir):
    path = os.path.join(repo, "README.md")
    if not os.path.isfile(path):
        return ["README.md:1: no README.md"]
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    blocks = quick_start_blocks(text)
    if not blocks:
        return ["README.md:1: no \"Quick start\" heading with sh/bash/shell/console code "
                "blocks under it"]
    problems = []
    for first, lines in blocks:
        for lineno, line in logical_lines(first, lines):
            where = f"README.md:{lineno}"
            cmds, err = split_commands(line)
            if cmds is None:
                problems.append(f"{where}: cannot parse the command line ({err})")
                continue
            for words in cmds:
                problems.extend(check_command(words, repo, build_dir, where))
    return problems


TREE_FOLDERS = ("deploy", "tests", "conf", "docs", "server", "worker", "common", "kernels")
CODE_WORD_SPLIT_RE = re.compile(r"[\s=`'\"(),;|]+")


def check_code_paths(repo, rel):
    """Every path into the tree that code in a document names exists."""
    problems = []
    with open(os.path.join(repo, rel), encoding="utf-8") as fh:
        text = fh.read()
    outside = dict(lines_outside_fences(text))
    for lineno, line in enumerate(text.split("\n"), 1):
        if FENCE_RE.match(line):
            continue
        spans = [m.group(2) for m in CODE_SPAN_RE.finditer(line)] if lineno in outside else [line]
        for span in spans:
            for word in CODE_WORD_SPLIT_RE.split(span):
                word = word.split("#", 1)[0].rstrip(".:")
                if "/" not in word or any(c in word for c in "$*?~<>{["):
                    continue
                if word.split("/", 1)[0] in TREE_FOLDERS and not os.path.exists(os.path.join(repo, word)):
                    problems.append(f"{rel}:{lineno}: path '{word}' does not exist")
    return problems


def check_wording(repo, rel):
    """README's length, and issue numbers anywhere."""
    problems = []
    with open(os.path.join(repo, rel), encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if rel == "README.md" and len(lines) > README_MAX_LINES:
        problems.append(f"{rel}:{README_MAX_LINES + 1}: README.md has {len(lines)} lines, more "
                        f"than {README_MAX_LINES}: move detail into docs/")
    for lineno, line in enumerate(lines, 1):
        m = ISSUE_RE.search(line)
        if m:
            problems.append(f"{rel}:{lineno}: '{m.group(0)}': say what changed in words, not "
                            "which issue it was")
    return problems


PROTO_DOC_RE = re.compile(r"\bprotocol version ([0-9]+)\b", re.IGNORECASE)


def proto_version(repo):
    """PSAGG_PROTO_VERSION as common/runtime/wire.h defines it, or None."""
    try:
        with open(os.path.join(repo, "common/runtime/wire.h"), encoding="utf-8") as fh:
            m = re.search(r"#define\s+PSAGG_PROTO_VERSION\s+([0-9]+)", fh.read())
    except OSError:
        return None
    return int(m.group(1)) if m else None


def check_wire_facts(repo, rel, version):
    """Every 'protocol version N' names the version the code speaks."""
    problems = []
    if version is None:
        return problems
    with open(os.path.join(repo, rel), encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            for m in PROTO_DOC_RE.finditer(line):
                if int(m.group(1)) != version:
                    problems.append(f"{rel}:{lineno}: '{m.group(0)}': the code speaks protocol "
                                    f"version {version} (PSAGG_PROTO_VERSION, "
                                    "common/runtime/wire.h)")
    return problems


FEATURES_BEGIN = "<!-- psagg-server --features -->"
FEATURES_END = "<!-- end psagg-server --features -->"


WIRE_TYPE_RE = re.compile(r"^\s*PSAGG_(CTL|MSG)_([A-Z_]+) = [0-9]+", re.M)


def check_message_table(repo):
    """docs/design.md names every message type of wire.h."""
    rel = "docs/design.md"
    try:
        with open(os.path.join(repo, "common/runtime/wire.h"), encoding="utf-8") as fh:
            types = WIRE_TYPE_RE.findall(fh.read())
        with open(os.path.join(repo, rel), encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return []
    return [f"{rel}:1: the message table does not name {name} (PSAGG_{kind}_{name} in "
            "common/runtime/wire.h)" for kind, name in types
            if not re.search(r"(?<![A-Z_])" + name + r"(?![A-Z_])", text)]


def check_features(repo, build_dir):
    """docs/features.md's table is what the build's psagg-server --features prints."""
    rel = "docs/features.md"
    path = os.path.join(repo, rel)
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    try:
        first = lines.index(FEATURES_BEGIN) + 1
        last = lines.index(FEATURES_END)
    except ValueError:
        return [f"{rel}:1: no '{FEATURES_BEGIN}' ... '{FEATURES_END}' block"]
    server = os.path.join(build_dir, "server", "psagg-server")
    if not os.access(server, os.X_OK):
        return [f"{rel}:{first + 1}: {server} is not built: the feature table cannot be compared"]
    out = subprocess.run([server, "--features"], capture_output=True, text=True).stdout
    want = out.rstrip("\n").split("\n")
    have = lines[first:last]
    while have and have[-1] == "":
        have.pop()
    if have != want:
        at = next((i for i, (a, b) in enumerate(zip(have, want)) if a != b), min(len(have), len(want)))
        return [f"{rel}:{first + at + 1}: the feature table differs from `psagg-server --features` "
                f"(line {at + 1} of the block: {have[at] if at < len(have) else '(missing)'!r}, "
                f"the code says {want[at] if at < len(want) else '(nothing)'!r}): paste its "
                "output"]
    return []


CODE_SUFFIXES = (".c", ".h", ".cu", ".cuh", ".py", ".sh", ".txt", ".ini", ".cmake", ".json",
                 ".awk", ".service")
CODE_SKIP = ("build", ".git", "tests/fuzz/corpus", "tests/data")


def code_files(repo):
    """The repository's own code, scripts and build files (relative paths)."""
    out = []
    for dirpath, dirs, files in os.walk(repo):
        rel_dir = os.path.relpath(dirpath, repo)
        dirs[:] = sorted(d for d in dirs
                         if not any(os.path.normpath(os.path.join(rel_dir, d)).startswith(s)
                                    for s in CODE_SKIP) and not d.startswith("build")
                         and d != "dist"  # (pip wheel -w dist; a venv, below: not ours)
                         and not os.path.exists(os.path.join(dirpath, d, "pyvenv.cfg")))
        for f in sorted(files):
            rel = os.path.normpath(os.path.join(rel_dir, f))
            script = rel.startswith("deploy" + os.sep) and "." not in f
            if f.endswith(CODE_SUFFIXES) or script or f == "CMakeLists.txt":
                out.append(rel)
    return out


def check_code_wording(repo):
    """No issue numbers in code either."""
    problems = []
    for rel in code_files(repo):
        try:
            with open(os.path.join(repo, rel), encoding="utf-8") as fh:
                for lineno, line in enumerate(fh, 1):
                    m = ISSUE_RE.search(line)
                    if m:
                        problems.append(f"{rel}:{lineno}: '{m.group(0)}': say what the code does "
                                        "or why, not which issue it came from")
        except (OSError, UnicodeDecodeError):
            continue
    return problems


C_COMMENT_RE = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\\n])*\"", re.S)
FILE_WORD_RE = re.compile(r"(?<![\w/.-])([A-Za-z0-9_][A-Za-z0-9_/-]*\.(?:c|h|cu|cuh|py|sh))\b")
SYSTEM_INCLUDES = ("/usr/include", "/usr/local/cuda/include")


def tree_names(repo):
    """Every file name in the tree (its basename), and the system headers (name and path)."""
    names = set()
    for dirpath, dirs, files in os.walk(repo):
        dirs[:] = [d for d in dirs if d != ".git" and not d.startswith("build")]
        names.update(files)
    for root in SYSTEM_INCLUDES:
        for dirpath, _, files in os.walk(root):
            for f in files:
                names.add(f)
                names.add(os.path.relpath(os.path.join(dirpath, f), root))
    return names


def check_code_files_named(repo):
    """Every file a C comment names exists (in the tree, or a system header)."""
    problems, names = [], tree_names(repo)
    for rel in code_files(repo):
        if not rel.endswith((".c", ".h", ".cu", ".cuh")):
            continue
        try:
            with open(os.path.join(repo, rel), encoding="utf-8") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError):
            continue
        for m in C_COMMENT_RE.finditer(text):
            if m.group(0).startswith('"'):
                continue  # a string: the message a program prints names what it likes
            for w in FILE_WORD_RE.finditer(m.group(0)):
                word = w.group(1)
                if os.path.basename(word) in names or word in names:
                    continue
                lineno = text.count("\n", 0, m.start() + w.start()) + 1
                problems.append(f"{rel}:{lineno}: names {word}, which is no file of the tree "
                                "(renamed or removed?) nor a system header")
    return problems


GROW_RE = re.compile(r"Structs that grow\. Every public struct[^(]*\(([^)]*)\)", re.S)


def check_growing_structs(repo):
    """psagg.h's list of structs that grow is every public struct with a struct_size."""
    rel = "worker/include/psagg.h"
    try:
        with open(os.path.join(repo, rel), encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return []
    m = GROW_RE.search(text)
    if not m:
        return [f"{rel}:1: no list of the structs that grow (\"Structs that grow. Every public "
                "struct ... (A, B, ...)\")"]
    listed = set(re.findall(r"psagg_\w+", m.group(1)))
    actual = set(re.findall(r"typedef struct (psagg_\w+) \{\s*size_t struct_size;", text))
    lineno = text.count("\n", 0, m.start()) + 1
    problems = []
    for name in sorted(actual - listed):
        problems.append(f"{rel}:{lineno}: the structs that grow leave out {name}, which starts "
                        "with size_t struct_size")
    for name in sorted(listed - actual):
        problems.append(f"{rel}:{lineno}: the structs that grow name {name}, which has no "
                        "struct_size first")
    return problems


def check(repo, build_dir):
    """Return the list of problems ("file:line: message") in repo's documentation."""
    problems = []
    version = proto_version(repo)
    for rel in documents(repo):
        problems.extend(check_links(repo, rel))
        problems.extend(check_wording(repo, rel))
        problems.extend(check_wire_facts(repo, rel, version))
        problems.extend(check_code_paths(repo, rel))
    problems.extend(check_quick_start(repo, build_dir))
    problems.extend(check_features(repo, build_dir))
    problems.extend(check_message_table(repo))
    problems.extend(check_code_wording(repo))
    problems.extend(check_code_files_named(repo))
    problems.extend(check_growing_structs(repo))
    return problems


def self_test(repo, build_dir):
    """Plant faults in a copy of the documents; each must be reported at its file:line."""
    with open(os.path.join(repo, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    blocks = quick_start_blocks(readme)
    if not blocks:
        print("self-test: README.md has no quick start to plant commands in")
        return 1
    qs_line = blocks[0][0]  # the first line inside the first shell block of the quick start
    first_doc = next((d for d in documents(repo) if d.startswith("docs/")), None)
    # (file, line to insert before (1-based), text, what the report must contain); the report
    # is expected at that line, or for the README that grew too long, at its first line too many
    plants = [
        ("README.md", qs_line, "deploy/psagg-nosuch --config conf/local.ini",
         "program 'deploy/psagg-nosuch' does not exist"),
        ("README.md", qs_line, "deploy/psagg-local --config conf/local.ini -- build/nosuch/prog",
         "program 'build/nosuch/prog' does not exist"),
        ("README.md", qs_line, "conf/local.ini --check", "program 'conf/local.ini' is not executable"),
        ("README.md", qs_line, "/usr/bin/env python3 worker/examples/nosuch.py",
         "script 'worker/examples/nosuch.py' does not exist"),
        ("README.md", 2, "See [the page](docs/no-such-page.md).", "'docs/no-such-page.md': no such file"),
        ("README.md", 2, "\n" * README_MAX_LINES, f"more than {README_MAX_LINES}"),
    ]
    if first_doc:
        plants += [
            (first_doc, 2, "See [nothing](../no/such/file.c) here.", "'../no/such/file.c': no such file"),
            (first_doc, 2, "See [x](../README.md#no-such-heading).", "no heading with the anchor '#no-such-heading'"),
            (first_doc, 2, "See [x](#no-such-heading-here).", "anchor '#no-such-heading-here'"),
            (first_doc, 2, "As issue%s13 asked." % " ", "'issue%s13': say what changed" % " "),
            (first_doc, 2, "The wire is protocol version 1.",
             "'protocol version 1': the code speaks protocol version"),
            (first_doc, 2, "Run `tests/bench/bench-nosuch.sh --steps 2` for it.",
             "path 'tests/bench/bench-nosuch.sh' does not exist"),
        ]
        # a line inside the first fenced block of a page that has one
        for doc in (d for d in documents(repo) if d.startswith("docs/")):
            with open(os.path.join(repo, doc), encoding="utf-8") as fh:
                fence = next((n for n, l in enumerate(fh, 1) if FENCE_RE.match(l)), None)
            if fence:
                plants.append((doc, fence + 1, "deploy/nosuch --config conf/local.ini",
                               "path 'deploy/nosuch' does not exist"))
                break
    features = os.path.join(repo, "docs/features.md")
    if os.path.isfile(features):
        with open(features, encoding="utf-8") as fh:
            flines = fh.read().split("\n")
        if FEATURES_BEGIN in flines:
            at = flines.index(FEATURES_BEGIN) + 2
            plants.append(("docs/features.md", at, "| a row the code does not print |",
                           "the feature table differs from `psagg-server --features`"))
    # a code file of the copy's own (the code is linked from the repository: never written)
    plants.append(("zz_plant/plant.c", 1, "/* as issue%s7 asked */" % " ",
                   "'issue%s7': say what the code does" % " "))
    plants.append(("zz_plant/plant.c", 1, "/* see no_such_file.c */",
                   "names no_such_file.c, which is no file of the tree"))
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        # the documents are copied; everything else is linked, so links and commands resolve
        for entry in os.listdir(repo):
            if entry in ("README.md", "docs", ".git"):
                continue
            os.symlink(os.path.join(os.path.abspath(repo), entry), os.path.join(tmp, entry))
        shutil.copy(os.path.join(repo, "README.md"), os.path.join(tmp, "README.md"))
        if os.path.isdir(os.path.join(repo, "docs")):
            shutil.copytree(os.path.join(repo, "docs"), os.path.join(tmp, "docs"))
        os.mkdir(os.path.join(tmp, "zz_plant"))
        with open(os.path.join(tmp, "zz_plant", "plant.c"), "w", encoding="utf-8") as fh:
            fh.write("\n")
        clean = check(tmp, build_dir)
        if clean:
            print("self-test: the unmodified copy already has problems:", *clean, sep="\n  ")
            return 1
        for rel, lineno, plant, want in plants:
            at = README_MAX_LINES + 1 if plant.count("\n") >= README_MAX_LINES else lineno
            shown = f"{plant.count(chr(10))} blank lines" if not plant.strip() else repr(plant[:60])
            path = os.path.join(tmp, rel)
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            lines = text.split("\n")
            lines.insert(lineno - 1, plant)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write("\n".join(lines))
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--build-dir",
                                   build_dir, tmp], capture_output=True, text=True)
            expect = f"{rel}:{at}: "
            hit = [l for l in proc.stdout.splitlines() if l.startswith(expect) and want in l]
            if proc.returncode != 1 or not hit:
                print(f"self-test FAILED: planting {shown} at {rel}:{lineno}: exit "
                      f"{proc.returncode}, wanted a line starting '{expect}' containing "
                      f"'{want}'; got:\n{proc.stdout}{proc.stderr}")
                failures += 1
            else:
                print(f"self-test: planted {shown} at {rel}:{lineno}: reported as: {hit[0]}")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
    print("self-test:", "FAILED" if failures else f"all {len(plants)} planted faults reported")
    return 1 if failures else 0


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.normpath(os.path.join(here, "..", ".."))
    args = argv[1:]
    selftest = "--self-test" in args
    args = [a for a in args if a != "--self-test"]
    build_dir = None
    if "--build-dir" in args:
        k = args.index("--build-dir")
        if k + 1 >= len(args):
            print("check_docs: --build-dir needs a directory")
            return 2
        build_dir = args[k + 1]
        del args[k:k + 2]
    if args:
        repo = args[0]
    build_dir = os.path.abspath(build_dir or os.path.join(repo, "build"))
    if selftest:
        return self_test(repo, build_dir)
    problems = check(repo, build_dir)
    for p in problems:
        print(p)
    if problems:
        print(f"check_docs: {len(problems)} problem(s) in README.md and docs/")
        return 1
    print(f"check_docs: every relative link in README.md and docs/ resolves, every quick-start "
          f"command and every path named in code exists (build directory {build_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
