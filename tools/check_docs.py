#!/usr/bin/env python3
"""Checks that every reference in the repository points somewhere that exists.

    python3 tools/check_docs.py [REPO_ROOT]

What it checks, in every file git tracks (or, outside a git checkout, every file under the
root), and exits 1 naming each reference that points nowhere:
  * Markdown links and images, [text](target) in *.md: the target file or directory exists, and
    a #anchor names a heading of the target (GitHub's heading slugs).
  * file:line references such as ops/norm.cpp:40 or core/tensor.h:24-110 (a path with a
    directory), in any text file: the file exists and has that many lines.
  * docs/<page>.md references in code and build files (with an optional #anchor): the page
    exists and has the heading.
  * the guided tour (docs/tour.md): each stop's "Look for" names text found inside the stop's
    line range, so that the ranges follow the code when it moves.
  * every --flag the README and docs/*.md name is one the program or its tools define (a string
    literal in examples/, bench/, tools/, qk or .ci/), or another program's (EXTERNAL_FLAGS).
  * nothing cites notes kept outside the repository.
A file whose text says "check_docs: made-up references" is skipped.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
TEXT_SUFFIXES = (".md", ".h", ".cpp", ".cu", ".py", ".sh", ".toml", ".build", ".txt", ".json")
SOURCE_SUFFIXES = (".h", ".cpp", ".cu", ".py", ".sh", ".build")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
# A path with at least one directory: bare names (a.cu:10 in an error message) are not checked.
FILE_LINE = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]+\.(?:h|cpp|cu|md|py|toml|sh|build)):(\d+)(?:-(\d+))?\b")
DOC_REF = re.compile(r"(?<![\w./-])(docs/[\w./-]+\.md)(#[\w-]+)?")
# Built from pieces so that this file does not match itself.
OUTSIDE = re.compile("|".join([r"DESIGN\s*" + "\u00a7", r"\.\./shared/", "DESIGN" + r"\.md"]))
SKIP_MARK = "check_docs: " + "made-up references"
TOUR_STOP = re.compile(r"^#+ .*?`((?:[\w.-]+/)*[\w.-]+):(\d+)-(\d+)`")
TOUR_FIND = re.compile(r"^Look for:\s*`([^`]+)`")

FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
FLAG_LITERAL = re.compile(r"[\"',]\s*(--[a-z][a-z0-9-]*)")
# Flags of other programs the docs show: mpirun, srun, meson, pkg-config, huggingface-cli.
EXTERNAL_FLAGS = {"--hostfile", "--oversubscribe", "--ntasks-per-node", "--prefix", "--libdir",
                  "--cflags", "--libs", "--local-dir"}

errors = []


def tracked_files():
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files"], capture_output=True, text=True, check=True).stdout
        files = [f for f in out.splitlines() if f]
        # Files added to the work tree but not yet to git count too (a docs page being written).
        extra = subprocess.run(["git", "-C", ROOT, "ls-files", "--others", "--exclude-standard"],
                               capture_output=True, text=True, check=True).stdout
        files += [f for f in extra.splitlines() if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for base, dirs, names in os.walk(ROOT):
            dirs[:] = [d for d in dirs if not d.startswith((".", "build")) and d not in ("runs", "sweeps")]
            files += [os.path.relpath(os.path.join(base, n), ROOT) for n in names]
    return sorted(f for f in files if os.path.isfile(os.path.join(ROOT, f)))


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
        return f.read()


def slug(heading):
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        found, seen, in_code = set(), {}, False
        for line in read(path).splitlines():
            if line.startswith("```"):
                in_code = not in_code
            m = None if in_code else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                base = slug(m.group(1))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        _anchors[path] = found
    return _anchors[path]


def line_count(path):
    return read(path).count("\n") + (0 if read(path).endswith("\n") else 1)


def resolve(source, target, bases=None):
    """A path as written in `source`: relative to its directory, else to the root."""
    for base in bases if bases is not None else (os.path.dirname(source), ""):
        candidate = os.path.normpath(os.path.join(base, target))
        if not candidate.startswith("..") and os.path.exists(os.path.join(ROOT, candidate)):
            return candidate
    return None


def where(path, text, offset):
    return f"{path}:{text.count(chr(10), 0, offset) + 1}"


def check_anchor(source, text, offset, page, anchor):
    if page.endswith(".md") and anchor and anchor not in anchors(page):
        errors.append(f"{where(source, text, offset)}: #{anchor} is not a heading of {page}")


def strip_code(text):
    """Markdown without fenced code blocks and inline code (their brackets are not links)."""
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), text)


def check_links(path, text):
    prose = strip_code(text)
    for m in LINK.finditer(prose):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        page, _, anchor = target.partition("#")
        if not page:
            check_anchor(path, text, m.start(), path, anchor)
            continue
        page = re.sub(r"#L\d+(-L\d+)?$", "", page)
        found = resolve(path, page, bases=[os.path.dirname(path)])  # as a Markdown viewer reads it
        if not found:
            errors.append(f"{where(path, text, m.start())}: link to {target}: no such file "
                          f"(relative to {os.path.dirname(path) or 'the root'})")
        else:
            check_anchor(path, text, m.start(), found, anchor)


def check_file_lines(path, text):
    for m in FILE_LINE.finditer(text):
        target, first = m.group(1), int(m.group(2))
        last = int(m.group(3) or first)
        found = resolve(path, target)
        if not found:
            errors.append(f"{where(path, text, m.start())}: {m.group(0)}: no such file")
        elif not 1 <= first <= last <= line_count(found):
            errors.append(f"{where(path, text, m.start())}: {m.group(0)}: {found} has "
                          f"{line_count(found)} lines")


def check_doc_refs(path, text):
    for m in DOC_REF.finditer(text):
        page, anchor = m.group(1), (m.group(2) or "#")[1:]
        if not os.path.isfile(os.path.join(ROOT, page)):
            errors.append(f"{where(path, text, m.start())}: {page}: no such page")
        else:
            check_anchor(path, text, m.start(), page, anchor)


def check_tour(path):
    lines = read(path).splitlines()
    stop = None
    stops = 0
    for number, line in enumerate(lines, 1):
        m = TOUR_STOP.match(line)
        if m:
            stop = (m.group(1), int(m.group(2)), int(m.group(3)), number)
            stops += 1
            continue
        m = TOUR_FIND.match(line)
        if m and stop:
            file, first, last, at = stop
            if not os.path.isfile(os.path.join(ROOT, file)):
                continue  # reported as a file:line reference
            code = read(file).splitlines()[first - 1:last]
            if not any(m.group(1) in c for c in code):
                errors.append(f"{path}:{number}: `{m.group(1)}` is not in {file}:{first}-{last} "
                              f"(the stop at line {at}: move its range to where the code is now)")
            stop = None
    if stops == 0:
        errors.append(f"{path}: no stops found (headings with `file:first-last`)")


def defined_flags(files):
    """The --flags that the program and its tools define, from their sources' string literals."""
    flags = set()
    for path in files:
        shell = path == "qk" or path.endswith(".sh") or path.startswith(".ci/")
        if shell:  # a shell script's flags need no quotes
            flags |= set(FLAG.findall(read(path)))
        elif path.startswith(("examples/", "bench/", "tools/")):
            flags |= set(FLAG_LITERAL.findall(read(path)))
    return flags


def check_flags(path, text, defined):
    for m in FLAG.finditer(text):
        if m.group(1) not in defined and m.group(1) not in EXTERNAL_FLAGS:
            errors.append(f"{where(path, text, m.start())}: {m.group(1)} is not a flag of qknorm or "
                          f"of its tools (a renamed or removed flag?)")


def main():
    files = tracked_files()
    defined = defined_flags(files)
    for path in files:
        if not path.endswith(TEXT_SUFFIXES) and os.path.basename(path) not in ("qk", "run"):
            continue
        if path.startswith(("tools/fuzz/corpus", "examples/stability/results", "data/")):
            continue
        text = read(path)
        if SKIP_MARK in text:  # a file of made-up references, such as the checker's own test
            continue
        if path.endswith(".md"):
            check_links(path, text)
        if defined and (path == "README.md" or (path.startswith("docs/") and path.endswith(".md"))):
            check_flags(path, text, defined)
        check_file_lines(path, text)
        if path.endswith(SOURCE_SUFFIXES) or path.endswith(".md"):
            check_doc_refs(path, text)
        for m in OUTSIDE.finditer(text):
            errors.append(f"{where(path, text, m.start())}: cites notes outside the repository")
    if os.path.isfile(os.path.join(ROOT, "docs/tour.md")):
        check_tour("docs/tour.md")
    for e in errors:
        print(e)
    print(f"check_docs: {len(files)} files, {len(errors)} broken reference(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
