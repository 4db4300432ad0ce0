#!/usr/bin/env python3
"""The umbrella headers gather every installed header: a quick twin of tools/install_check.sh's
compiler-driven check, run with the test suite so that a new header left out of nn.h or qk.h is
caught before CI's install check.

usage: check_headers.py SOURCE_ROOT

The installed list is meson.build's install_headers(files(...)); what an umbrella reaches is
followed through the project's own #include "..." lines. nn.h must reach every installed header
and qk.h (the engine) none under nn/."""
import re
import sys
from pathlib import Path


def installed_headers(root):
    meson = (root / "meson.build").read_text()
    block = re.search(r"install_headers\(files\((.*?)\)", meson, re.S)
    if not block:
        sys.exit("check_headers: no install_headers(files(...)) in meson.build")
    return set(re.findall(r"'([^']+\.h)'", block.group(1)))


def reach(root, header):
    seen, todo = set(), [header]
    while todo:
        h = todo.pop()
        if h in seen or not (root / h).is_file():
            continue
        seen.add(h)
        todo += re.findall(r'^#include "([^"]+)"', (root / h).read_text(), re.M)
    return seen


def main():
    root = Path(sys.argv[1])
    installed = installed_headers(root)
    problems = []
    missing = sorted(installed - reach(root, "nn.h"))
    if missing:
        problems.append("nn.h (with qk.h) does not reach: " + " ".join(missing))
    nn_in_qk = sorted(h for h in reach(root, "qk.h") if h.startswith("nn/") or h == "nn.h")
    if nn_in_qk:
        problems.append("qk.h (the engine) reaches nn headers: " + " ".join(nn_in_qk))
    uninstalled = sorted(h for h in reach(root, "nn.h") if h not in installed)
    if uninstalled:
        problems.append("the umbrellas include headers that are not installed: " +
                        " ".join(uninstalled))
    for p in problems:
        print("check_headers:", p)
    print(f"check_headers: {len(installed)} installed headers, "
          f"{'ok' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
