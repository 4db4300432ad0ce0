#!/usr/bin/env python3
"""tools/check_docs.py must fail on each kind of broken reference, and pass a clean tree.

    python3 tests/test_check_docs.py tools/check_docs.py

(check_docs: made-up references — the fixtures below point nowhere on purpose.)
"""
import os
import subprocess
import sys
import tempfile

CHECKER = os.path.abspath(sys.argv[1])


def run(files):
    with tempfile.TemporaryDirectory() as root:  # not a git checkout: every file is checked
        for path, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        done = subprocess.run([sys.executable, CHECKER, root], capture_output=True, text=True)
        return done.returncode, done.stdout


CLEAN = {
    "src/op.cpp": "// The op's math: docs/guide.md#the-op. The loop: src/op.cpp:1-3.\nint x;\nint y;\n",
    "docs/guide.md": "# Guide\n\n## The op\n\nSee [the code](../src/op.cpp) and [below](#the-op), src/op.cpp:2.\n",
    "docs/tour.md": "# Tour\n\n## 1. The op — `src/op.cpp:1-3`\n\nLook for: `int y;`\n",
}

BROKEN = [
    ("a link to a missing file", {"docs/guide.md": CLEAN["docs/guide.md"] + "[x](../src/gone.cpp)\n"}, "no such file"),
    ("a link to a missing heading", {"docs/guide.md": CLEAN["docs/guide.md"] + "[x](#nowhere)\n"}, "#nowhere is not a heading"),
    ("a line past the end", {"docs/guide.md": CLEAN["docs/guide.md"] + "src/op.cpp:4\n"}, "has 3 lines"),
    ("a range past the end", {"src/op.cpp": CLEAN["src/op.cpp"].replace("1-3", "2-9")}, "has 3 lines"),
    ("a file:line to a missing file", {"src/op.cpp": "// src/other.cpp:1\n"}, "no such file"),
    ("a missing docs page", {"src/op.cpp": "// docs/missing.md\nint x;\nint y;\n"}, "no such page"),
    ("a docs anchor that is not a heading", {"src/op.cpp": "// docs/guide.md#elsewhere\nint x;\nint y;\n"}, "#elsewhere is not a heading"),
    ("a tour stop whose code moved", {"docs/tour.md": CLEAN["docs/tour.md"].replace("int y;", "int z;")}, "is not in src/op.cpp:1-3"),
    ("a flag the program does not define", {"examples/prog.cpp": 'add_option("--real,--alias", x);\n',
                                            "docs/guide.md": CLEAN["docs/guide.md"] + "Run `prog --real --alias --fake`.\n"},
     "--fake is not a flag"),
    ("notes outside the repository", {"src/op.cpp": "// see ../" + "shared/notes\nint x;\nint y;\n"}, "outside the repository"),
]

failures = []
status, out = run(CLEAN)
if status != 0:
    failures.append(f"the clean tree failed:\n{out}")
with_flags = {**CLEAN, "examples/prog.cpp": 'add_option("--real,--alias", x);\n',
              "docs/guide.md": CLEAN["docs/guide.md"] + "Run `prog --real --alias --prefix`.\n"}
status, out = run(with_flags)
if status != 0:
    failures.append(f"the flags the program defines were refused:\n{out}")
for what, change, expected in BROKEN:
    status, out = run({**CLEAN, **change})
    if status != 1 or expected not in out:
        failures.append(f"{what}: expected exit 1 and '{expected}', got {status}:\n{out}")
for f in failures:
    print(f)
print(f"test_check_docs: {len(BROKEN) + 2 - len(failures)} of {len(BROKEN) + 2} cases right")
sys.exit(1 if failures else 0)
