#!/usr/bin/env bash
# install_check: qknorm as a user of the installed package sees it (./qk install-check, CI).
#
#   tools/install_check.sh [--source DIR] [meson options...]
#
# Configures a packaging build (-Dnative=false, no tests or benchmarks) in DIR/build-install,
# installs it into DIR/build-install/prefix, and checks what a distribution would ship: only
# headers under include/qk, each compiling on its own, qk.h (the engine) and nn.h (the nn layer)
# gathering them; a versioned SONAME; a pkg-config file whose
# flags are enough (-std=c++20) and private about the backends (no OpenBLAS, MPI or oneDNN in a
# user's flags); no -march=native and no AVX code in the library; and tools/install_example.cpp
# built out of tree with `pkg-config --cflags --libs qk` alone, run, and finding the bundled data
# in the prefix. DIR is this checkout unless --source names another (e.g. an older commit's tree,
# to compare). Every check runs; the exit status is 1 when any failed.
set -euo pipefail

tools=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$tools/.." && pwd)
if [ "${1:-}" = --source ]; then
    src=$(cd "$2" && pwd)
    shift 2
fi
build=$src/build-install
prefix=$build/prefix
work=$build/check
start=$SECONDS

echo "== install check of $src"
reconfigure=()
[ -f "$build/build.ninja" ] && reconfigure=(--reconfigure)
meson setup "${reconfigure[@]}" "$build" "$src" --prefix "$prefix" -Dnative=false -Dtests=false \
    -Dbench=false "$@" >"$build.setup.log" 2>&1 || { cat "$build.setup.log"; exit 1; }
ninja -C "$build"
rm -rf "$prefix" "$work"
mkdir -p "$work"
meson install -C "$build" --quiet

failed=()
check() {  # check NAME OK [DETAIL]: one line of the report
    if [ "$2" = 1 ]; then
        echo "PASS  $1"
    else
        echo "FAIL  $1${3:+: $3}"
        failed+=("$1")
    fi
}
ok() { "$@" >/dev/null 2>&1 && echo 1 || echo 0; }

pc=$(find "$prefix" -name qk.pc | head -n 1)
lib=$(find "$prefix" -name 'libqk.so' | head -n 1)
include=$prefix/include
PKG_CONFIG_PATH=$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_PATH LD_LIBRARY_PATH
cflags=$(pkg-config --cflags qk)
libs=$(pkg-config --libs qk)
echo "pkg-config --cflags qk: $cflags"
echo "pkg-config --libs qk:   $libs"

# The build: the portable flags reached every target (the CUDA emulation library included).
native=$(grep -c -- '-march=native' "$build/compile_commands.json" || true)
check "build: no -march=native in any compile command" "$([ "$native" = 0 ] && echo 1 || echo 0)" \
    "$native commands"

# The install tree: headers only, none of them branching on the library's own build defines (a
# user compiles without them, and must see the same class layouts).
stray=$(cd "$include/qk" && find . -type f ! -name '*.h' | sed 's|^\./||' | sort | tr '\n' ' ')
check "install: only headers under include/qk" "$([ -z "$stray" ] && echo 1 || echo 0)" "$stray"
branching=$(grep -rlE '^\s*#\s*(if|ifdef|ifndef|elif)\b.*QK_(WITH|CUDA)_' "$include/qk" |
    sed "s|^$include/||" | tr '\n' ' ' || true)
check "install: no header depends on QK_WITH_*/QK_CUDA_*" \
    "$([ -z "$branching" ] && echo 1 || echo 0)" "$branching"

# The library: a versioned SONAME, and code for any x86-64 (AVX only where dispatched at run
# time, which libqk leaves to oneDNN and OpenBLAS).
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
check "lib: versioned SONAME" "$([[ "$soname" =~ ^libqk\.so\.[0-9]+$ ]] && echo 1 || echo 0)" \
    "SONAME '${soname:-none}'"
avx=$(objdump -d --no-show-raw-insn "$(readlink -f "$lib")" | grep -cE '%[yz]mm[0-9]' || true)
check "lib: no AVX/AVX-512 instructions (portable x86-64)" "$([ "$avx" = 0 ] && echo 1 || echo 0)" \
    "$avx instructions use ymm/zmm registers"

# The pkg-config file.
check "pc: -std=c++20 in --cflags" "$([[ " $cflags " == *" -std=c++20 "* ]] && echo 1 || echo 0)"
leaks=$(echo "$cflags $libs" | tr ' ' '\n' | grep -iE 'openblas|cblas|mpi|dnnl|gomp' | tr '\n' ' ' ||
    true)
check "pc: no OpenBLAS/MPI/oneDNN in --cflags or --libs" "$([ -z "$leaks" ] && echo 1 || echo 0)" \
    "$leaks"

# Each installed header on its own, with the pc file's flags and nothing else.
cxx=${CXX:-c++}
(cd "$include/qk" && find . -name '*.h' | sed 's|^\./||' | sort) >"$work/headers"
xargs -P "$(nproc)" -I{} sh -c "echo '#include <qk/{}>' | $cxx -x c++ -fsyntax-only -Wall \
    -Wextra -Werror $cflags - >/dev/null 2>&1 || echo {}" <"$work/headers" >"$work/bad_headers" ||
    true
bad=$(sort "$work/bad_headers" | tr '\n' ' ')
check "headers: each of $(wc -l <"$work/headers") compiles alone (-Wall -Wextra -Werror)" \
    "$([ -z "$bad" ] && echo 1 || echo 0)" "$bad"
# ... and the two umbrella headers gather them all: qk.h the engine, nn.h (which includes qk.h)
# the nn layer. An installed header that neither reaches is internal, or missing from them.
reach() {  # reach HEADER: the installed headers that <qk/HEADER> includes, itself too (none when
    # it is missing or does not compile: the checks below report it)
    # shellcheck disable=SC2086  # the flags are words
    echo "#include <qk/$1>" | $cxx -x c++ -M $cflags - 2>/dev/null |
        grep -oE "$include/qk/[^ ]+\.h" | sed "s|^$include/qk/||" | sort -u || true
}
reach qk.h >"$work/reached_qk"
reach nn.h >"$work/reached_nn"
unreached=$(comm -23 "$work/headers" "$work/reached_nn" | tr '\n' ' ')
check "headers: nn.h (with qk.h) reaches every installed header" \
    "$([ -z "$unreached" ] && echo 1 || echo 0)" "$unreached"
# qk.h is the engine alone: nothing of the nn layer.
nn_in_qk=$(grep -E '^nn(/|\.h$)' "$work/reached_qk" | tr '\n' ' ' || true)
check "headers: qk.h (the engine) reaches no nn header" \
    "$([ -z "$nn_in_qk" ] && echo 1 || echo 0)" "$nn_in_qk"

# A program of the user's: pkg-config's flags only, the library found through LD_LIBRARY_PATH.
# shellcheck disable=SC2086  # the flags are words
built=$(ok "$cxx" -O1 -Wall -Wextra -o "$work/example" "$tools/install_example.cpp" $cflags $libs)
if [ "$built" = 0 ]; then
    # shellcheck disable=SC2086
    "$cxx" -O1 -Wall -Wextra -o "$work/example" "$tools/install_example.cpp" $cflags $libs 2>&1 |
        grep -m 5 error || true
fi
check "example: builds with pkg-config --cflags --libs qk" "$built"
ran=0
data=""
if [ "$built" = 1 ] && (cd "$work" && ./example) >"$work/example.log" 2>&1; then ran=1; fi
[ -f "$work/example.log" ] && sed 's/^/    /' "$work/example.log"
[ -f "$work/example.log" ] && data=$(sed -n 's/^default data: //p' "$work/example.log")
check "example: runs (tensors, autograd, Linear, GPT + AdamW)" "$ran"
check "example: bundled data found in the prefix" \
    "$([[ "$data" == "$prefix"/* ]] && echo 1 || echo 0)" "${data:-not reached}"

if [ ${#failed[@]} = 0 ]; then
    echo "== install check: all passed ($((SECONDS - start)) s)"
else
    echo "== install check: ${#failed[@]} failed ($((SECONDS - start)) s)"
    exit 1
fi
