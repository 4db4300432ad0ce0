#!/usr/bin/env python3
"""Counts the machine instructions of the tensor-core attention kernels' inner loops, without a GPU.

    python3 tools/sass_census.py [BUILD_DIR] [--arch sm_90] [--kernels REGEX]
    python3 tools/sass_census.py --self-test

BUILD_DIR is an nvcc-configured tree (default build-nvcc, see docs/cuda.md). For each source of
the attention kernels the tool takes the tree's own compile command from compile_commands.json,
compiles it for one architecture with `ptxas -v` (registers, spilled bytes), disassembles the
object with cuobjdump, and prints, for each kernel, its main loop (the longest backward branch:
one key or query tile per warp) and the loop's plain-tile path: the fewest instructions round it,
which skip every branch that adds work (mask edges, cap and FP8 rules, loading a next tile). That
is the path of nearly every tile of a long causal run, short of the next tile's copy, and the
figure to lower: the kernels issue one instruction at a time and their time followed this count
when it fell (docs/cuda.md, "Counting instructions without a GPU").

cuobjdump is part of the CUDA toolkit; where the toolkit was installed without it, `pip install
nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` provides it and the disassembler it runs (both land in
the same bin/ folder; set CUOBJDUMP to that folder's cuobjdump).
"""
import argparse
import collections
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

SOURCES = ("cuda/attention_mma.cu", "cuda/attention_mma_backward.cu")
INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
FUNCTION = re.compile(r"Function : (\S+)")
PTXAS_NAME = re.compile(r"(?:Compiling entry function|Function properties for) '?([\w$]+)'?")
PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
PTXAS_REGS = re.compile(r"Used (\d+) registers")


def parse_sass(text):
    """{mangled name: [(address, opcode, operands, guarded)]} from cuobjdump -sass output."""
    functions, current = {}, None
    for line in text.splitlines():
        m = FUNCTION.search(line)
        if m:
            current = functions.setdefault(m.group(1), [])
            continue
        m = INSTRUCTION.match(line)
        if m and current is not None:
            guard = (m.group(2) or "").strip()
            current.append((int(m.group(1), 16), m.group(3), m.group(4), guard not in ("", "@PT")))
    return functions


def branch_target(opcode, operands):
    m = re.search(r"0x([0-9a-f]+)", operands) if opcode.startswith("BRA") else None
    return int(m.group(1), 16) if m else None


def main_loop(instructions):
    """The instructions between the target and the source of the longest backward branch."""
    index = {address: i for i, (address, *_) in enumerate(instructions)}
    best = []
    for i, (address, opcode, operands, _) in enumerate(instructions):
        target = branch_target(opcode, operands)
        if target is not None and target <= address and target in index:
            start = index[target]
            if i + 1 - start > len(best):
                best = instructions[start : i + 1]
    return best


def plain_tile_path(loop):
    """The plain tile's way round the loop, from its head to its back edge: the fewest
    reconvergence points (BSSY: a branch that threads of a warp may take apart, as the tested
    per-pair rules' do; a tile whose every pair is hidden skips their arithmetic and would
    otherwise be the shortest), then the fewest calls (a 64-bit division's slow path, whose body
    is elsewhere: its inline 32-bit twin is the one that runs), then the fewest instructions —
    which skips every branch that adds work (mask edges, cap and FP8 rules, loading a next tile).
    Branches are the only control flow inside the kernels' loops, and they jump forward."""
    index = {address: i for i, (address, *_) in enumerate(loop)}
    n = len(loop)
    cost, previous = [None] * n, [None] * n

    def weight(opcode):  # (reconvergence points, calls, instructions) an instruction adds
        return int(opcode.startswith("BSSY")), int(opcode.startswith("CALL")), 1

    cost[0] = weight(loop[0][1])
    for i in range(n):  # forward edges only, so one pass in order settles every cost
        if cost[i] is None:
            continue
        address, opcode, operands, guarded = loop[i]
        target = branch_target(opcode, operands)
        conditional = guarded or "," in operands  # @P0 BRA x, or BRA P1, x
        successors = []
        if target is not None and target in index and index[target] > i:
            successors.append(index[target])
        if target is None or conditional:
            successors.append(i + 1)
        for j in successors:
            if j >= n:
                continue
            step = tuple(a + b for a, b in zip(cost[i], weight(loop[j][1])))
            if cost[j] is None or step < cost[j]:
                cost[j], previous[j] = step, i
    path, i = [], n - 1
    while i is not None:
        path.append(loop[i])
        i = previous[i]
    return path[::-1] if cost[n - 1] is not None else []


def parse_ptxas(text):
    """{mangled name: (registers, spill stores, spill loads)} from ptxas -v output."""
    found, current = {}, None
    for line in text.splitlines():
        m = PTXAS_NAME.search(line)
        if m:
            current = m.group(1)
        m = PTXAS_SPILL.search(line)
        if m and current:
            found.setdefault(current, [0, 0, 0])[1:] = [int(m.group(2)), int(m.group(3))]
        m = PTXAS_REGS.search(line)
        if m and current:
            found.setdefault(current, [0, 0, 0])[0] = int(m.group(1))
    return found


def demangle(names):
    filt = shutil.which("c++filt")
    if not filt:
        return {n: n for n in names}
    out = subprocess.run([filt], input="\n".join(names), capture_output=True, text=True).stdout
    pretty = [re.sub(r"\(.*", "", s.replace("qk::cuda::(anonymous namespace)::", "")
                     .replace("void ", "")) for s in out.splitlines()]
    return dict(zip(names, pretty))


def census_rows(sass_text, ptxas_text, kernels):
    """One row per kernel matching the regex: name, registers, spilled bytes, the loop's length
    over every path, and the opcodes of its plain-tile path."""
    functions, usage = parse_sass(sass_text), parse_ptxas(ptxas_text)
    pretty = demangle(list(functions))
    rows = []
    for name, instructions in functions.items():
        if not re.search(kernels, pretty[name]):
            continue
        loop = main_loop(instructions)
        path = plain_tile_path(loop)
        if loop and not path:
            print(f"sass_census: {pretty[name]}: no way round its loop found", file=sys.stderr)
        ops = collections.Counter(opcode.split(".")[0] for _, opcode, _, _ in path)
        regs, spill_st, spill_ld = usage.get(name, (0, 0, 0))
        rows.append((pretty[name], regs, spill_st, spill_ld, len(loop), len(path), ops))
    # Kernels by name, then head size as a number.
    return sorted(rows, key=lambda r: [int(w) if w.isdigit() else w for w in re.split(r"(\d+)", r[0])])


def print_table(rows):
    print("| kernel | registers | spilled bytes (st/ld) | loop, every path | plain tile | mma | "
          "ldmatrix | local (spill) accesses | instructions per mma |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, regs, st, ld, total, plain, ops in rows:
        mma = ops["HMMA"]
        per = f"{plain / mma:.2f}" if mma else "-"
        print(f"| {name} | {regs} | {st}/{ld} | {total} | {plain} | {mma} | {ops['LDSM']} | "
              f"{ops['STL'] + ops['LDL']} | {per} |")


def compile_commands(build_dir):
    path = os.path.join(build_dir, "compile_commands.json")
    if not os.path.exists(path):
        sys.exit(f"sass_census: {path} not found: configure an nvcc tree first (docs/cuda.md)")
    with open(path) as f:
        return json.load(f)


def cuobjdump():
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    if not os.path.exists(tool):
        sys.exit("sass_census: cuobjdump not found (CUDA toolkit; or `pip install "
                 "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` and set CUOBJDUMP to its "
                 "bin/cuobjdump)")
    return tool


def census(build_dir, arch, kernels):
    entries = compile_commands(build_dir)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for source in SOURCES:
            entry = next((e for e in entries if e["file"].endswith(source)), None)
            if entry is None:
                sys.exit(f"sass_census: {source} is not compiled in {build_dir} (an nvcc tree?)")
            command = shlex.split(entry["command"])
            if not os.path.basename(command[0]).startswith("nvcc"):
                sys.exit(f"sass_census: {source} is compiled by {command[0]}, not nvcc: "
                         f"{build_dir} is an emulation tree")
            obj = os.path.join(scratch, os.path.basename(source) + ".o")
            args, skip = [], False
            for word in command:
                if skip:
                    skip = False
                    continue
                if word == "-o":
                    skip = True
                    continue
                if word.startswith("-gencode"):
                    continue
                args.append(word)
            args[1:1] = [f"-gencode=arch=compute_{arch[3:]},code={arch}", "-Xptxas", "-v", "-o", obj]
            built = subprocess.run(args, cwd=entry["directory"], capture_output=True, text=True)
            if built.returncode != 0:
                sys.exit(f"sass_census: compiling {source} failed:\n{built.stderr}")
            dumped = subprocess.run([cuobjdump(), "-sass", obj], capture_output=True, text=True)
            if dumped.returncode != 0:  # e.g. no nvdisasm beside cuobjdump
                sys.exit(f"sass_census: cuobjdump failed:\n{dumped.stderr}{dumped.stdout}")
            sass = dumped.stdout
            rows += census_rows(sass, built.stderr, kernels)
    return rows


SELF_TEST_SASS = """
        Function : _Z6kernelPf
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDSM.16.M88.4 R4, [R2] ;
        /*0020*/                   HMMA.16816.F32.BF16 R8, R4, R6, R8 ;
        /*0030*/                   BRA P1, 0x70 ;
        /*0040*/                   STL [R1], R8 ;
        /*0050*/                   FMUL R8, R8, R8 ;
        /*0060*/                   BRA 0x80 ;
        /*0070*/                   HMMA.16816.F32.BF16 R12, R4, R6, R12 ;
        /*0080*/              @!P0 BRA 0x10 ;
        /*0090*/                   LDSM.16.MT88.4 R4, [R2+0x400] ;
        /*00a0*/                   BRA 0x90 ;
        /*00b0*/                   EXIT ;
        Function : _Z5otherv
        /*0000*/                   EXIT ;
        Function : _Z6testedv
        /*0000*/                   HMMA.16816.F32.BF16 R8, R4, R6, R8 ;
        /*0010*/                   BRA P1, 0x40 ;
        /*0020*/                   BSSY B0, 0x30 ;
        /*0030*/                   BRA 0x80 ;
        /*0040*/                   MUFU.EX2 R9, R9 ;
        /*0050*/                   FMUL R9, R9, R9 ;
        /*0060*/                   MUFU.EX2 R10, R10 ;
        /*0070*/                   FMUL R10, R10, R10 ;
        /*0080*/              @P0 BRA 0x0 ;
"""
SELF_TEST_PTXAS = """ptxas info    : Compiling entry function '_Z6kernelPf' for 'sm_90'
ptxas info    : Function properties for _Z6kernelPf
    8 bytes stack frame, 12 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers
"""


def self_test():
    rows = census_rows(SELF_TEST_SASS, SELF_TEST_PTXAS, "kernel")
    assert len(rows) == 1, rows
    name, regs, st, ld, total, plain, ops = rows[0]
    assert (regs, st, ld) == (168, 12, 4), (regs, st, ld)
    # The longest backward branch is 0x80 -> 0x10 (8 instructions), not 0xa0 -> 0x90 (2); its
    # shortest way round takes BRA P1 to 0x70 and skips the STL and FMUL: 0x10 0x20 0x30 0x70 0x80.
    assert total == 8 and plain == 5, (total, plain)
    assert ops["HMMA"] == 2 and ops["LDSM"] == 1 and ops["STL"] == 0 and ops["BRA"] == 2, ops
    # A tested rule that skips every pair (through a BSSY) is shorter than the plain rule, which
    # is the one counted: 0x0 0x10 0x40 0x50 0x60 0x70 0x80.
    (_, _, _, _, _, plain, ops), = census_rows(SELF_TEST_SASS, SELF_TEST_PTXAS, "tested")
    assert plain == 7 and ops["MUFU"] == 2 and ops["BSSY"] == 0, (plain, ops)
    assert census_rows(SELF_TEST_SASS, SELF_TEST_PTXAS, "nothing") == []
    print("sass_census: self-test passed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("build_dir", nargs="?", default="build-nvcc")
    parser.add_argument("--arch", default="sm_90", help="sm_80 or sm_90 (default sm_90)")
    parser.add_argument("--kernels", default=r"attention_(forward|dq|dkdv)_mma_kernel<qk::bf16",
                        help="regex over the demangled kernel names")
    parser.add_argument("--self-test", action="store_true", help="check the parsers and exit")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    print_table(census(args.build_dir, args.arch, args.kernels))


if __name__ == "__main__":
    main()
