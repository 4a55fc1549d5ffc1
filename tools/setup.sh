#!/usr/bin/env bash
# Checks that what one kind of target needs is there, and installs the
# missing Debian packages when root (otherwise prints the exact apt-get
# command and fails). Each need is checked by trying it (a C program linked
# with the library, a command run), not by asking dpkg, so a library built
# from source counts too.
#   tools/setup.sh build   make, make demo: a C compiler
#   tools/setup.sh test    make test: a C compiler and cmocka (python3 and
#                          pkg-config are optional: their tests skip)
#   tools/setup.sh bench   make bench: also jemalloc and mimalloc
#   tools/setup.sh fresh-root   .ci/fresh_root.sh: debootstrap
# The fuzz targets check for clang's libFuzzer themselves (make fuzz).
# Called by make through a stamp file per kind, so it runs once.
set -u
kind=${1:-test}
CC=${CC:-cc}
probe=$(mktemp -d "${TMPDIR:-/tmp}/tally-setup-XXXXXX")
trap 'rm -rf "$probe"' EXIT

# links LIB HEADER: a program including HEADER links with -lLIB.
links() {
  printf '#include <%s>\nint main(void) { return 0; }\n' "$2" >"$probe/p.c"
  $CC "$probe/p.c" -o "$probe/p" -l"$1" >/dev/null 2>&1
}
# cmocka's header needs these before it.
cmocka_links() {
  printf '#include <stdarg.h>\n#include <stddef.h>\n#include <stdint.h>\n#include <setjmp.h>\n#include <cmocka.h>\n%s\n' \
    'int main(void) { const struct CMUnitTest t[1] = {{0}}; (void)t; return 0; }' >"$probe/p.c"
  $CC "$probe/p.c" -o "$probe/p" -lcmocka >/dev/null 2>&1
}

missing=""
need() { missing="$missing $1"; }
[ "$kind" = fresh-root ] || command -v "$CC" >/dev/null 2>&1 || need build-essential
case $kind in
  build) ;;
  fresh-root)
    command -v debootstrap >/dev/null 2>&1 || need debootstrap ;;
  test)
    cmocka_links || need libcmocka-dev ;;
  bench)
    links jemalloc jemalloc/jemalloc.h || need libjemalloc-dev
    links mimalloc mimalloc.h || need libmimalloc-dev ;;
  *)
    echo "setup: unknown kind '$kind' (valid: build, test, bench, fresh-root)" >&2; exit 2 ;;
esac
# Optional: runtime libraries loaded with dlopen (libdw names file:line in
# reports, libunwind is the fast unwinder, jemalloc serves tally's metadata
# when it is in the process: test_core_meta_faults preloads it) and pkg-config (the install
# check builds with it), python3 (the Python tests), locales (the de_DE
# source test_report_json_reader compiles with localedef, to read numbers
# under a decimal comma). Without them those
# tests skip; as root they are installed with the rest.
if [ "$kind" = test ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  ldconfig -p 2>/dev/null | grep -q 'libdw\.so\.1 ' || need libdw1
  ldconfig -p 2>/dev/null | grep -q 'libunwind\.so\.8 ' || need libunwind8
  ldconfig -p 2>/dev/null | grep -q 'libjemalloc\.so\.2 ' || need libjemalloc2
  command -v pkg-config >/dev/null 2>&1 || need pkg-config
  command -v python3 >/dev/null 2>&1 || need python3
  [ -e /usr/share/i18n/locales/de_DE ] || need locales
fi
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq $missing >/dev/null || {
    echo "setup: apt-get install$missing failed" >&2; exit 1; }
  exit 0
fi
echo "setup: make $kind needs:$missing" >&2
echo "setup: run: sudo apt-get install -y$missing" >&2
exit 1
