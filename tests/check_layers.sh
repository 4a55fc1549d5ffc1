#!/usr/bin/env bash
# Calls run one way through lib/'s layers (docs/architecture.md): each layer
# folder's README.md says "rank: N", and an object file of a layer may refer
# only to functions and data defined in its own layer or in a layer of lower
# rank. Every lib/**/*.c and *.cc is compiled with -O0 -fno-inline, so the
# static inline functions of headers are emitted where they are used and
# their calls count too; nm then gives each object's defined and undefined
# symbols. A reference upwards fails, naming the symbol, the two files and
# the two layers.
#
# A second check shows that the first can fail: a probe object placed in
# the lowest layer that calls a function of the highest must be caught.
# Prints "ok NAME" or "FAIL NAME: why" per check (tests/run.sh counts them).
set -u
. "$(dirname "$0")/checkutil.sh"
cd "$root"
CC=${CC:-cc}
CXX=${CXX:-c++}

# Layers and their ranks, from lib/*/README.md.
declare -A rank
for readme in lib/*/README.md; do
  layer=$(basename "$(dirname "$readme")")
  r=$(sed -n 's/^rank: *\([0-9][0-9]*\).*/\1/p' "$readme" | head -1)
  if [ -z "$r" ]; then bad "layer ranks" "$readme has no 'rank: N' line"; exit 1; fi
  rank[$layer]=$r
done
for src in $(find lib -mindepth 2 -name '*.c' -o -mindepth 2 -name '*.cc' | sort); do
  layer=$(echo "$src" | cut -d/ -f2)
  [ -n "${rank[$layer]:-}" ] || { bad "layer ranks" "$src is in lib/$layer/, which has no README.md with 'rank: N'"; exit 1; }
done
loose=$(find lib -maxdepth 1 -name '*.c' -o -maxdepth 1 -name '*.cc' -o -maxdepth 1 -name '*.h' | sort)
[ -z "$loose" ] && ok "every source file is in a layer folder" ||
  bad "every source file is in a layer folder" "outside any layer: $loose"

# Compile every source; on error say which.
mkdir -p "$tmp/obj"
compile() { # src obj
  case "$1" in
    *.cc) $CXX -std=c++17 -O0 -fno-inline -fPIC -fvisibility=hidden -Iinclude -Ilib -c "$1" -o "$2" ;;
    *) $CC -std=c11 -D_GNU_SOURCE -O0 -fno-inline -fPIC -fvisibility=hidden -Iinclude -Ilib -c "$1" -o "$2" ;;
  esac
}
objs=()
for src in $(find lib -mindepth 2 \( -name '*.c' -o -name '*.cc' \) | sort); do
  o="$tmp/obj/$(echo "$src" | tr / _).o"
  if ! compile "$src" "$o" 2>"$tmp/cc.log"; then
    bad "layers build" "$src does not compile: $(head -3 "$tmp/cc.log" | tr '\n' ' ')"
    exit 1
  fi
  objs+=("$src=$o")
done

# check_calls SRC=OBJ...: prints one line per upward reference.
check_calls() {
  local pair src o layer
  : >"$tmp/defs"
  : >"$tmp/refs"
  for pair in "$@"; do
    src=${pair%%=*}; o=${pair#*=}
    layer=$(echo "$src" | cut -d/ -f2)
    nm "$o" | awk -v s="$src" -v l="$layer" -v r="${rank[$layer]}" \
      'NF == 3 && $2 ~ /^[TDBRCVWG]$/ {print $3, s, l, r}' >>"$tmp/defs"
    nm "$o" | awk -v s="$src" -v l="$layer" -v r="${rank[$layer]}" \
      'NF == 2 && $1 == "U" {print $2, s, l, r}' >>"$tmp/refs"
  done
  awk 'NR == FNR {def[$1] = $2 " " $3 " " $4; next}
       ($1 in def) {split(def[$1], d, " ");
         if (d[3] + 0 > $4 + 0)
           printf "%s (%s, rank %d) refers to %s, defined in %s (%s, rank %d)\n", $2, $3, $4, $1, d[1], d[2], d[3]}' \
    "$tmp/defs" "$tmp/refs" | sort -u
}

up=$(check_calls "${objs[@]}")
if [ -z "$up" ]; then
  ok "calls run one way ($(printf '%s\n' "${!rank[@]}" | wc -l) layers, ${#objs[@]} files)"
else
  bad "calls run one way" "$(printf '%s\n' "$up" | wc -l) upward references:"
  printf '%s\n' "$up" | sed 's/^/  /'
fi

# The check can fail: a probe in the lowest layer calling the highest's
# public entry point (tally_torch_alloc) must be named.
low=$(for l in "${!rank[@]}"; do echo "${rank[$l]} $l"; done | sort -n | head -1 | cut -d' ' -f2)
printf 'void *tally_torch_alloc(unsigned long size, int device, void *stream);\nvoid *probe(void) { return tally_torch_alloc(1, 0, 0); }\n' \
  >"$tmp/probe.c"
compile "$tmp/probe.c" "$tmp/probe.o"
caught=$(check_calls "${objs[@]}" "lib/$low/probe.c=$tmp/probe.o" | grep "^lib/$low/probe.c .*refers to tally_torch_alloc" || true)
[ -n "$caught" ] && ok "an upward call is caught: $caught" ||
  bad "an upward call is caught" "a probe in lib/$low/ calling tally_torch_alloc was not reported"
exit $failed
