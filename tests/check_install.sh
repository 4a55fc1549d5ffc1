#!/usr/bin/env bash
# make install into a temporary PREFIX, then as a user of the installed
# library would: a program built with `pkg-config --cflags --libs tally`
# runs without LD_LIBRARY_PATH and loads the installed libtally.so.MAJOR;
# docs/api.md's static link line links a program that needs no libtally.so;
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
if ! command -v pkg-config >/dev/null 2>&1; then
  skip pkg-config "pkg-config is not installed (apt-get install pkg-config)"
else
  # Shared: what a user types, run with no LD_LIBRARY_PATH at all.
  if cc app.c $(pkg-config --cflags --libs tally) -o app-shared 2>"$tmp/cc.log"; then
    out=$(env -u LD_LIBRARY_PATH TALLY_CONF=backend:host ./app-shared 2>&1)
    if [ "$out" = "tally $version allocated" ]; then ok "shared link runs without LD_LIBRARY_PATH"
    else bad "shared link runs without LD_LIBRARY_PATH" "./app-shared printed: $out"; fi
    loaded=$(env -u LD_LIBRARY_PATH ldd ./app-shared 2>/dev/null | grep 'libtally')
    case "$loaded" in
      *"libtally.so.$major => $prefix/lib/libtally.so.$major"*) ok "loads the installed libtally.so.$major" ;;
      *) bad "loads the installed libtally.so.$major" "ldd says: ${loaded:-no libtally}" ;;
    esac
  else
    bad "shared link" "cc app.c \$(pkg-config --cflags --libs tally) failed: $(head -3 "$tmp/cc.log")"
  fi
  # Static: the line docs/api.md gives, exactly.
  line=$(grep -m1 '^cc app.c .*tally-static' "$root/docs/api.md")
  if [ -z "$line" ]; then
    bad "static link line" "docs/api.md has no line starting 'cc app.c' with tally-static"
  elif bash -c "$line" 2>"$tmp/cc.log" && [ -x app ]; then
    out=$(env -u LD_LIBRARY_PATH TALLY_CONF=backend:host ./app 2>&1)
    if [ "$out" = "tally $version allocated" ] && ! ldd ./app 2>/dev/null | grep -q libtally; then
      ok "docs/api.md static link line"
    else bad "docs/api.md static link line" "./app printed '$out' or needs libtally.so"; fi
  else
    bad "docs/api.md static link line" "'$line' failed: $(head -3 "$tmp/cc.log")"
  fi
fi
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
