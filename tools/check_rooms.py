#!/usr/bin/env python3
"""The nn/ folders ("rooms") depend on each other in one direction only: this check fails on an
#include that points against the arrows, and on any include cycle among the project's headers.

usage: check_rooms.py SOURCE_ROOT [--self-test]

--self-test also proves that the check can fail: it copies nn/ into a scratch tree, plants an
include of a training header in a model file, and expects exactly that line to be reported.

The arrows (docs/architecture.md, "The rooms of nn/"): a room may include the engine (core/,
autograd/, ops/, qk.h) and the rooms listed after it in ALLOWED, nothing else. nn/ itself holds
only the rooms (folders) and the umbrella header nn.h lives at the top level."""
import re
import shutil
import sys
import tempfile
from pathlib import Path

# room -> the rooms its files may include (its own room always)
ALLOWED = {
    "model": set(),
    "text": {"model"},  # a run directory's tokenizer is read from its model checkpoint's name
    "hf": {"model", "text"},
    "optim": {"model"},
    "signals": {"model", "text"},
    "train": {"model", "text", "hf", "optim", "signals"},
    "lab": {"model", "text", "hf", "optim", "signals", "train"},
}
ENGINE = ("core/", "autograd/", "ops/", "cuda/")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def room_of(path):
    parts = path.split("/")
    return parts[1] if len(parts) == 3 and parts[0] == "nn" else None


def check_layout(root, problems):
    for entry in sorted((root / "nn").iterdir()):
        if entry.is_file():
            problems.append(f"nn/{entry.name}: nn/ holds only its rooms (folders)")
        elif entry.name not in ALLOWED:
            problems.append(f"nn/{entry.name}/: not a known room (add it to ALLOWED and the docs)")


def check_arrows(root, problems):
    for path in sorted((root / "nn").rglob("*")):
        if path.suffix not in (".h", ".cpp"):
            continue
        rel = path.relative_to(root).as_posix()
        room = room_of(rel)
        text = path.read_text(encoding="utf-8")
        for number, line in enumerate(text.splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            if target.startswith(ENGINE) or target == "qk.h":
                continue
            target_room = room_of(target)
            if target_room is None:
                problems.append(f"{rel}:{number}: includes {target}, outside the engine and the rooms")
            elif target_room != room and target_room not in ALLOWED.get(room, set()):
                problems.append(f"{rel}:{number}: nn/{room}/ must not include {target} "
                                f"(nn/{room}/ may use: {', '.join(sorted(ALLOWED[room])) or 'the engine only'})")


def check_cycles(root, problems):
    """Depth-first search over the headers' own includes; a back edge is a cycle."""
    headers = {p.relative_to(root).as_posix() for d in ("core", "autograd", "ops", "cuda", "nn")
               for p in (root / d).rglob("*.h")}
    edges = {h: [t for t in INCLUDE.findall((root / h).read_text(encoding="utf-8")) if t in headers]
             for h in headers}
    state = {}

    def visit(h, stack):
        state[h] = "open"
        stack.append(h)
        for t in edges[h]:
            if state.get(t) == "open":
                problems.append("include cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[h] = "done"

    for h in sorted(headers):
        if h not in state:
            visit(h, [])


def problems_in(root):
    problems = []
    check_layout(root, problems)
    check_arrows(root, problems)
    check_cycles(root, problems)
    return problems


def self_test(root):
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch)
        for d in ("core", "autograd", "ops", "cuda", "nn"):
            shutil.copytree(root / d, copy / d, ignore=shutil.ignore_patterns("*.md"))
        victim = copy / "nn/model/gpt.h"
        victim.write_text('#include "nn/train/trainer.h"\n' + victim.read_text(encoding="utf-8"))
        found = problems_in(copy)
        if not any(p.startswith("nn/model/gpt.h:1: nn/model/ must not include nn/train/trainer.h")
                   for p in found):
            sys.exit("check_rooms --self-test: a model file including a training header was not "
                     f"reported (found: {found})")


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
    if "--self-test" in sys.argv:
        self_test(root)
    problems = problems_in(root)
    for p in problems:
        print(p)
    if problems:
        sys.exit(f"check_rooms: {len(problems)} problem(s); the arrows are in docs/architecture.md")
    print(f"check_rooms: nn/ rooms {', '.join(ALLOWED)}: every include follows the arrows, no cycle")


if __name__ == "__main__":
    main()
