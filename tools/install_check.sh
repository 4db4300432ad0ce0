#!/usr/bin/env bash
# install_check: qknorm as a user of the installed package sees it (./qk install-check, CI).
#
#   tools/install_check.sh [--source DIR]
#
# Follows README.md's install recipe word for word: its two ```sh blocks marked install-recipe
# (tools/readme_commands.py --install-recipe prints them), the first at the source root (it
# configures build-pkg and installs into $HOME/.local), the second in a scratch project folder
# whose my_program.cpp is tools/install_example.cpp. HOME points at build-install/home, and
# neither PKG_CONFIG_PATH nor LD_LIBRARY_PATH is set: only what the README tells a user to set.
# Then it checks what a distribution would ship: only headers under include/qk, each compiling on
# its own, qk.h (the engine) and nn.h (the nn layer) gathering them; a versioned SONAME; a
# pkg-config file whose flags are enough (-std=c++20, the rpath) and private about the backends
# (no OpenBLAS, MPI or oneDNN in a user's flags); no -march=native and no AVX code in the
# library; and the program finding the bundled data in the prefix. DIR is this checkout unless
# --source names another (e.g. an older commit's tree, to compare). Every check runs; the exit
# status is 1 when any failed.
set -euo pipefail

tools=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$tools/.." && pwd)
if [ "${1:-}" = --source ]; then
    src=$(cd "$2" && pwd)
    shift 2
fi
home=$src/build-install/home
prefix=$home/.local
build=$src/build-pkg
work=$src/build-install/project
start=$SECONDS

echo "== install check of $src, following README.md's install recipe"
recipe() { python3 "$tools/readme_commands.py" "$src/README.md" --install-recipe "$1"; }
as_user() {  # as_user DIR: the recipe's lines from stdin, run in DIR as a fresh user's shell
    (cd "$1" && env -u PKG_CONFIG_PATH -u LD_LIBRARY_PATH HOME="$home" bash -euo pipefail -x)
}
rm -rf "$build" "$home" "$work"
mkdir -p "$home" "$work"
recipe source >"$src/build-install/recipe-source.sh"
recipe project >"$src/build-install/recipe-project.sh"
[ -s "$src/build-install/recipe-source.sh" ] && [ -s "$src/build-install/recipe-project.sh" ] ||
    { echo "README.md has no install-recipe blocks"; exit 1; }
as_user "$src" <"$src/build-install/recipe-source.sh" >"$src/build-install/install.log" 2>&1 ||
    { tail -n 30 "$src/build-install/install.log"; echo "FAIL  the README's install commands"; exit 1; }

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
# The checks' own queries (the user's program was built by the recipe, without these).
export PKG_CONFIG_PATH=$(dirname "$pc")
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

# The library: a versioned SONAME, and code for any x86-64: AVX only where dispatched at run
# time, which libqk leaves to oneDNN and OpenBLAS except in functions named *_avx512* or *_f16c*
# (compiled with a target attribute and called only on a CPU that has the instructions:
# ops/gemv_bf16.cpp, core/half_convert.cpp).
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
check "lib: versioned SONAME" "$([[ "$soname" =~ ^libqk\.so\.[0-9]+$ ]] && echo 1 || echo 0)" \
    "SONAME '${soname:-none}'"
# objdump -d names each function in a line "ADDRESS <symbol>:"; count the ymm/zmm instructions
# of the others, and name their functions.
avx=$(objdump -d --no-show-raw-insn "$(readlink -f "$lib")" | awk '
    /^[0-9a-f]+ <.*>:$/ { fn = $2; next }
    /%[yz]mm[0-9]/ && fn !~ /_(avx512|f16c)/ { n++; if (!(fn in seen)) { seen[fn] = 1; names = names " " fn } }
    END { printf "%d%s", n, names }')
check "lib: no AVX/AVX-512 instructions outside *_avx512* and *_f16c* (portable x86-64)" \
    "$([ "${avx%% *}" = 0 ] && echo 1 || echo 0)" "instructions using ymm/zmm registers: $avx"

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

# The user's program: the README's project block (export PKG_CONFIG_PATH, c++ with pkg-config's
# flags, ./my_program) in a fresh folder, nothing else set: the rpath finds the library.
cp "$tools/install_example.cpp" "$work/my_program.cpp"
ran=0
as_user "$work" <"$src/build-install/recipe-project.sh" >"$work/example.log" 2>&1 && ran=1
sed 's/^/    /' "$work/example.log"
data=$(sed -n 's/^default data: //p' "$work/example.log")
check "example: the README's project commands build and run it (tensors, autograd, Linear, GPT + AdamW)" "$ran"
check "example: bundled data found in the prefix" \
    "$([[ "$data" == "$prefix"/* ]] && echo 1 || echo 0)" "${data:-not reached}"
check "pc: an rpath to the installed library in --libs" \
    "$([[ " $libs " == *"-Wl,-rpath,$(dirname "$lib")"* ]] && echo 1 || echo 0)" "$libs"

if [ ${#failed[@]} = 0 ]; then
    echo "== install check: all passed ($((SECONDS - start)) s)"
else
    echo "== install check: ${#failed[@]} failed ($((SECONDS - start)) s)"
    exit 1
fi
