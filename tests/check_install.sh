#!/usr/bin/env bash
# make install into a temporary PREFIX, then as a user of the installed
# library would, with docs/api.md's link lines exactly: a program built with
# `pkg-config --cflags --libs tally` runs without LD_LIBRARY_PATH and loads
# the installed libtally.so.MAJOR; the tally-static line builds a program
# that needs no libtally.so; the build-tree line with its rpath runs too;
# the installed `tally` command runs; DESTDIR stages the same files under
# another root with the final PREFIX in tally.pc; make uninstall removes
# every file. Prints "ok NAME", "FAIL NAME: why" or "SKIP NAME: reason" per
# check (tests/run.sh counts them); exit 1 if any failed.
set -u
MAKE=${MAKE:-make}
BUILD=${BUILD:-build}
. "$(dirname "$0")/checkutil.sh"

prefix=$tmp/prefix
if ! $MAKE -s -C "$root" BUILD="$BUILD" install PREFIX="$prefix" >"$tmp/install.log" 2>&1; then
  bad install "make install PREFIX=$prefix failed:"; sed 's/^/  /' "$tmp/install.log"; exit 1
fi
major=$(sed -n 's/^#define TALLY_VERSION_MAJOR \([0-9]*\)/\1/p' "$root/include/tally.h")
version=$(sed -n 's/^#define TALLY_VERSION "\(.*\)"/\1/p' "$root/include/tally.h")
missing=""
for f in lib/libtally.so.$version lib/libtally.so.$major lib/libtally.so lib/libtally.a include/tally.h \
         lib/pkgconfig/tally.pc lib/pkgconfig/tally-static.pc bin/tally; do
  [ -e "$prefix/$f" ] || missing="$missing $f"
done
[ -z "$missing" ] && ok layout || bad layout "not installed:$missing"
[ "$(readlink "$prefix/lib/libtally.so")" = "libtally.so.$major" ] &&
  [ "$(readlink "$prefix/lib/libtally.so.$major")" = "libtally.so.$version" ] &&
  ok symlinks || bad symlinks "libtally.so -> $(readlink "$prefix/lib/libtally.so"), expected libtally.so.$major -> libtally.so.$version"

cat >"$tmp/app.c" <<'C'
#include <stdio.h>
#include <tally.h>
int main(void)
{
    void *p = tally_malloc(1 << 20, 0, NULL);
    printf("tally %s %s\n", tally_version(), p ? "allocated" : tally_last_error());
    tally_free(p);
    return p == NULL;
}
C
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
cd "$tmp" || exit 1
# link_and_run CHECK LINE WANT: LINE (a shell command building ./app) links,
# and ./app runs with no LD_LIBRARY_PATH at all, loading libtally.so.MAJOR
# from WANT (a directory), or no libtally.so when WANT is "static".
link_and_run() {
  local check=$1 line=$2 want=$3 out loaded
  rm -f app
  if [ -z "$line" ]; then bad "$check" "docs/api.md has no such line"; return; fi
  if ! bash -c "$line" 2>"$tmp/cc.log" || [ ! -x app ]; then
    bad "$check" "'$line' failed: $(head -3 "$tmp/cc.log")"; return
  fi
  out=$(env -u LD_LIBRARY_PATH TALLY_CONF=backend:host ./app 2>&1)
  loaded=$(env -u LD_LIBRARY_PATH ldd ./app 2>/dev/null | grep libtally)
  if [ "$out" != "tally $version allocated" ]; then
    bad "$check" "./app printed: $out"
  elif [ "$want" = static ] && [ -n "$loaded" ]; then
    bad "$check" "the static program needs a libtally.so: $loaded"
  elif [ "$want" != static ] && [[ "$loaded" != *"libtally.so.$major => $want/libtally.so.$major"* ]]; then
    bad "$check" "ldd says: ${loaded:-no libtally}; expected $want/libtally.so.$major"
  else
    ok "$check"
  fi
}

# The lines docs/api.md gives, exactly as a user would type them.
doc_line() { grep -m1 -F -- "$1" "$root/docs/api.md"; }
if ! command -v pkg-config >/dev/null 2>&1; then
  skip pkg-config "pkg-config is not installed (apt-get install pkg-config)"
else
  link_and_run "shared, pkg-config: runs without LD_LIBRARY_PATH" \
    "$(doc_line 'cc app.c $(pkg-config --cflags --libs tally) -o app')" "$prefix/lib"
  link_and_run "static, pkg-config: needs no libtally.so" \
    "$(doc_line 'cc app.c $(pkg-config --cflags --libs tally-static) -o app')" static
fi
# From the build tree, as docs/api.md says (its paths made absolute).
line=$(doc_line 'cc app.c -Iinclude -Lbuild/lib -ltally')
line=${line//-Iinclude/-I$root/include}
line=${line//-Lbuild\/lib/-L$root/$BUILD/lib}
line=${line//\$PWD\/build\/lib/$root/$BUILD/lib}
link_and_run "shared, build tree: runs without LD_LIBRARY_PATH" "$line" "$root/$BUILD/lib"
out=$(env -u LD_LIBRARY_PATH "$prefix/bin/tally" --help 2>&1 | head -1)
case "$out" in *usage*|*tally*) ok "installed tally command runs" ;; *) bad "installed tally command runs" "$out" ;; esac

# DESTDIR: staged under another root, tally.pc naming the final PREFIX.
stage=$tmp/stage
if $MAKE -s -C "$root" BUILD="$BUILD" install DESTDIR="$stage" PREFIX=/opt/tally >"$tmp/install.log" 2>&1 &&
   [ -e "$stage/opt/tally/lib/libtally.so.$major" ] && grep -qx 'prefix=/opt/tally' "$stage/opt/tally/lib/pkgconfig/tally.pc"; then
  ok DESTDIR
else
  bad DESTDIR "make install DESTDIR=$stage PREFIX=/opt/tally did not stage lib/ and tally.pc under $stage/opt/tally"
fi

# Uninstall: no file or link left in either tree.
$MAKE -s -C "$root" BUILD="$BUILD" uninstall PREFIX="$prefix" >/dev/null 2>&1
$MAKE -s -C "$root" BUILD="$BUILD" uninstall DESTDIR="$stage" PREFIX=/opt/tally >/dev/null 2>&1
left=$(find "$prefix" "$stage" \( -type f -o -type l \) 2>/dev/null | sed "s|$tmp/||" | tr '\n' ' ')
[ -z "$left" ] && ok uninstall || bad uninstall "left behind: $left"
exit $failed
