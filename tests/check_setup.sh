#!/usr/bin/env bash
# tools/setup.sh as a non-root user: `make test` needs a C compiler and
# cmocka and nothing else (not clang, jemalloc or mimalloc), a missing
# library is named with the exact apt-get command, and apt-get is never run
# without root. `id` and `apt-get` are stand-ins on PATH; the compiler is
# the real one, or a wrapper that cannot find one chosen library.
# Prints "ok NAME" or "FAIL NAME: why" per check (tests/run.sh counts them).
set -u
. "$(dirname "$0")/checkutil.sh"

mkdir "$tmp/bin"
printf '#!/bin/sh\n[ "$1" = -u ] && echo 1000 || echo "uid=1000"\n' >"$tmp/bin/id"
printf '#!/bin/sh\ntouch %s/apt-ran\nexit 1\n' "$tmp" >"$tmp/bin/apt-get"
# cc-without LIB: the real compiler, except that -lLIB is not found.
cat >"$tmp/bin/cc-without" <<'SH'
#!/bin/sh
lib=$1; shift
for a in "$@"; do [ "$a" = "-l$lib" ] && { echo "ld: cannot find -l$lib" >&2; exit 1; }; done
exec cc "$@"
SH
chmod +x "$tmp/bin/"*
export PATH="$tmp/bin:$PATH"
setup() { bash "$root/tools/setup.sh" "$@" >"$tmp/out" 2>&1; }

if setup test; then
  if [ -s "$tmp/out" ]; then bad "test with cmocka" "exit 0 but printed: $(head -2 "$tmp/out")"
  else ok "test: a compiler and cmocka are enough"; fi
else
  bad "test with cmocka" "failed as a user with a compiler and cmocka: $(cat "$tmp/out")"
fi

printf '#!/bin/sh\nexec cc-without cmocka "$@"\n' >"$tmp/bin/cc-no-cmocka"
chmod +x "$tmp/bin/cc-no-cmocka"
if CC=cc-no-cmocka setup test; then
  bad "test without cmocka" "exit 0 though -lcmocka does not link"
elif grep -q 'sudo apt-get install -y libcmocka-dev$' "$tmp/out" && ! grep -Eq 'clang|jemalloc|mimalloc' "$tmp/out"; then
  ok "test without cmocka: names libcmocka-dev only"
else
  bad "test without cmocka" "expected the apt-get line for libcmocka-dev alone, got: $(cat "$tmp/out")"
fi

printf '#!/bin/sh\nexec cc-without jemalloc "$@"\n' >"$tmp/bin/cc-no-jemalloc"
chmod +x "$tmp/bin/cc-no-jemalloc"
if CC=cc-no-jemalloc setup test; then ok "test does not need jemalloc"
else bad "test does not need jemalloc" "$(cat "$tmp/out")"; fi
if CC=cc-no-jemalloc setup bench; then
  bad "bench without jemalloc" "exit 0 though -ljemalloc does not link"
elif grep -Eq 'sudo apt-get install -y (libjemalloc-dev|libjemalloc-dev libmimalloc-dev)$' "$tmp/out" &&
     { ! grep -q libmimalloc-dev "$tmp/out" || ! printf 'int main(void){return 0;}\n' | cc -x c - -lmimalloc -o "$tmp/mi" 2>/dev/null; }; then
  # mimalloc is named too only where this machine lacks it as well.
  ok "bench without jemalloc: names libjemalloc-dev"
else
  bad "bench without jemalloc" "$(cat "$tmp/out")"
fi
# make and make demo: a compiler alone; without one, build-essential is named.
if CC=no-such-cc-here setup build; then bad "build without a compiler" "exit 0"
elif grep -q 'sudo apt-get install -y build-essential$' "$tmp/out"; then ok "build without a compiler: names build-essential"
else bad "build without a compiler" "$(cat "$tmp/out")"; fi
if setup build && [ ! -s "$tmp/out" ]; then ok "build needs a compiler only"
else bad "build needs a compiler only" "$(cat "$tmp/out")"; fi
[ -e "$tmp/apt-ran" ] && bad "no apt-get without root" "setup.sh ran apt-get as uid 1000" || ok "no apt-get without root"
if setup nosuchkind; then bad "unknown kind" "exit 0"
else grep -q "unknown kind 'nosuchkind' (valid: build, test, bench, fresh-root)" "$tmp/out" && ok "unknown kind" || bad "unknown kind" "$(cat "$tmp/out")"; fi
exit $failed
