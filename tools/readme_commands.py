#!/usr/bin/env python3
"""Runs every shell command README.md shows a user, in a short version, so that none can break.

    python3 tools/readme_commands.py README.md QKNORM        # meson test readme_commands
    python3 tools/readme_commands.py README.md --install-recipe source|project

Each line of each ```sh block is one command. The test runs them in order in a scratch folder,
where `./build/examples/qknorm` and `./qk run` are the qknorm program given as QKNORM (so the
train -> sample -> resume -> sweep chain is the README's), shortened: a tiny model, a few steps,
and a run directory of its own for each later train. `runs/<date-time>` is the run the first
train made. Two kinds of line are not run here, each for a reason the script names:
  * `./qk test` and the by-hand build: they are what runs this test;
  * the install recipe, the blocks that follow an `<!-- install-recipe: source -->` or
    `<!-- install-recipe: project -->` comment: `./qk install-check` (tools/install_check.sh) runs
    them word for word, taking them from this script's --install-recipe output.
A line that fits none of these fails the test: a new command in the README needs a way to run.
"""
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile

# Flags that make a train command short; the README's own flags come first and win.
SHORT_MODEL = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16"]
SHORT_TRAIN = SHORT_MODEL + ["--batch-size", "4", "--steps", "4", "--warmup", "1",
                             "--eval-every", "2", "--eval-batches", "1", "--sample-tokens", "20",
                             "--quiet"]
# A fine-tuning run takes its model from --init-from: only the training is shortened.
SHORT_FINE_TUNE = ["--context", "16"] + SHORT_TRAIN[len(SHORT_MODEL):]
SHORT_SWEEP = SHORT_MODEL + ["--batch-size", "4", "--steps", "2", "--eval-batches", "1",
                             "--variants", "baseline,qk_layernorm", "--lrs", "0.01",
                             "--seeds", "1"]
NOT_RUN_HERE = {
    "./qk test": "the README's test command: it runs this test",
    "meson setup build && meson compile -C build && meson test -C build":
        "the test command by hand: it runs this test",
}


def sh_blocks(path):
    """(kind, line number, command) for each command line; kind names an install-recipe block."""
    commands, kind, inside, marker = [], None, False, None
    for number, line in enumerate(open(path, encoding="utf-8"), 1):
        line = line.rstrip("\n")
        found = re.match(r"\s*<!--\s*install-recipe:\s*(\w+)\s*-->", line)
        if found:
            marker = found.group(1)
        elif not inside and line.strip() == "```sh":
            inside, kind, marker = True, marker, None
        elif inside and line.strip() == "```":
            inside = False
        elif inside:
            command = re.sub(r"\s+#.*$", "", line).strip()  # a trailing comment
            if command and not command.startswith("#"):
                commands.append((kind, number, command))
        elif line.strip():
            marker = None  # the comment must come right before its block
    return commands


def with_flags(args, extra):
    """args, then each flag of extra that args does not give already (extra's values)."""
    out = list(args)
    i = 0
    while i < len(extra):
        flag = extra[i]
        takes_value = i + 1 < len(extra) and not extra[i + 1].startswith("--")
        if flag not in args:
            out += extra[i:i + 2] if takes_value else [flag]
        i += 2 if takes_value else 1
    return out


def main():
    readme = sys.argv[1]
    if sys.argv[2] == "--install-recipe":
        for kind, _, command in sh_blocks(readme):
            if kind == sys.argv[3]:
                print(command)
        return 0
    qknorm = sys.argv[2]
    work = tempfile.mkdtemp(prefix="qk_readme_commands_")
    first_run, trains, failed, passed = None, 0, 0, 0
    for kind, number, command in sh_blocks(readme):
        where = f"README.md:{number}: {command}"
        if kind:
            print(f"{where}\n    not run here: the install recipe, run word for word by "
                  "./qk install-check")
            continue
        if command in NOT_RUN_HERE:
            print(f"{where}\n    not run here: {NOT_RUN_HERE[command]}")
            continue
        words = shlex.split(command)
        if words[:2] == ["./qk", "run"]:
            words = [qknorm, "train"] + words[2:]
        elif words[:1] == ["./build/examples/qknorm"]:
            words = [qknorm] + words[1:]
        else:
            print(f"{where}\n    FAILED: a command this test does not know how to run")
            failed += 1
            continue
        if "runs/<date-time>" in words:
            if first_run is None:
                print(f"{where}\n    FAILED: names runs/<date-time> before any train made one")
                failed += 1
                continue
            words = [first_run if w == "runs/<date-time>" else w for w in words]
        sub = words[1]
        if sub == "train" and "--resume" not in words:
            words = with_flags(words, SHORT_FINE_TUNE if "--init-from" in words else SHORT_TRAIN)
            if "--preset" in words:  # the tiny model cannot attend nanoGPT's 256 characters
                words = with_flags(words, ["--eval-protocol", "qknorm"])
            if first_run is not None and "--run-dir" not in words:  # one run per second's name
                words += ["--run-dir", f"runs/readme-{trains}"]
            trains += 1
        elif sub == "train":
            words = with_flags(words, ["--quiet"])
        elif sub == "sweep":
            words = with_flags(words, SHORT_SWEEP + ["--out", "sweep"])
        # errors="replace": an undertrained byte-level BPE model can sample invalid UTF-8.
        result = subprocess.run(words, cwd=work, capture_output=True, text=True, timeout=600,
                                errors="replace")
        shown = " ".join(shlex.quote(w) for w in words)
        if result.returncode != 0:
            failed += 1
            print(f"{where}\n    FAILED (exit {result.returncode}): {shown}\n"
                  f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
            continue
        print(f"{where}\n    ok: {shown}")
        passed += 1
        if first_run is None and sub == "train":
            made = sorted(glob.glob(os.path.join(work, "runs", "*")))
            first_run = os.path.relpath(made[-1], work) if made else None
    subprocess.run(["rm", "-rf", work])
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
