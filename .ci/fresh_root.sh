#!/usr/bin/env bash
# The README's promise on a fresh machine: `make demo`, then `make test`, in
# a clean Debian root (debootstrap --variant=minbase: no compiler, no
# cmocka, no python3) where none of this machine's packages are visible. The
# repository (tracked and untracked, not ignored, files: no build output) is
# copied in, with ../shared beside it as the tests expect. Only the
# project's own setup (tools/setup.sh, run by make as root) installs
# anything there, so a dependency that a machine merely happened to have
# fails here. Nothing is cached between runs: the root is made afresh and
# removed afterwards.
#   bash .ci/fresh_root.sh          (as root; .ci/run runs it)
# Skips, saying why (exit 0), where it is not root, or no Debian mirror is
# configured or reachable, or debootstrap cannot be installed.
# FRESH_ROOT_MIRROR overrides the mirror (default: the first Debian URI of
# /etc/apt/sources.list*), FRESH_ROOT_SUITE the suite (default: this
# machine's VERSION_CODENAME), FRESH_ROOT_KEEP=1 keeps the root.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
skip() { echo "fresh-root: skipped: $*"; exit 0; }

[ "$(id -u)" = 0 ] || skip "not root (debootstrap and chroot need root)"
command -v apt-get >/dev/null 2>&1 || skip "no apt-get (not a Debian machine)"

mirror=${FRESH_ROOT_MIRROR:-}
if [ -z "$mirror" ]; then
  # deb822 .sources files (URIs: ...) and one-line sources.list entries.
  mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }')
  [ -n "$mirror" ] || mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
    awk '$1 == "deb" { u = ($2 ~ /^\[/) ? $3 : $2; if (u !~ /security/) { print u; exit } }')
fi
[ -n "$mirror" ] || skip "no Debian mirror in /etc/apt/sources.list* (set FRESH_ROOT_MIRROR)"
suite=${FRESH_ROOT_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-}")}
[ -n "$suite" ] || skip "no suite (VERSION_CODENAME in /etc/os-release; set FRESH_ROOT_SUITE)"
host=$(echo "$mirror" | sed -E 's#^[a-z]+://([^/:]+).*#\1#')
port=80; case $mirror in https:*) port=443 ;; esac
timeout 10 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null || skip "mirror $mirror is not reachable"
if ! command -v debootstrap >/dev/null 2>&1; then
  bash tools/setup.sh fresh-root || skip "debootstrap is missing and could not be installed"
fi

t0=$SECONDS
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/tally-fresh-root-XXXXXX")
mounted=()
cleanup() {
  local m
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
  if [ "${FRESH_ROOT_KEEP:-0}" = 1 ]; then echo "fresh-root: kept $dir"; else rm -rf --one-file-system "$dir"; fi
}
trap cleanup EXIT

echo "fresh-root: debootstrap --variant=minbase $suite from $mirror into $dir"
if ! debootstrap --variant=minbase "$suite" "$dir" "$mirror" >"$dir.log" 2>&1; then
  tail -20 "$dir.log" >&2; rm -f "$dir.log"
  echo "fresh-root: debootstrap failed" >&2; exit 1
fi
rm -f "$dir.log"
echo "fresh-root: root made in $((SECONDS - t0)) s"
# The root's apt uses the same mirror (debootstrap wrote its sources.list).
cp /etc/resolv.conf "$dir/etc/resolv.conf"
mount -t proc proc "$dir/proc"; mounted+=("$dir/proc")
mount -t sysfs sys "$dir/sys"; mounted+=("$dir/sys")
# /dev with what is mounted under it, as a slave: unmounting it later
# cannot unmount this machine's /dev/pts or /dev/shm.
mount --rbind /dev "$dir/dev"; mount --make-rslave "$dir/dev"; mounted+=("$dir/dev")

# The repository as a clone would have it (plus uncommitted work), and the
# shared traces beside it.
mkdir -p "$dir/work/tally"
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$dir/work/tally"
if [ -d "$repo/../shared" ]; then cp -a "$repo/../shared" "$dir/work/shared"; fi

t1=$SECONDS
# The README's one prerequisite: make itself (its first step, apt-get
# install make); everything else comes from the project's setup.
echo "fresh-root: apt-get install make (the README's first step)"
chroot "$dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
  /bin/bash -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends make >/dev/null' ||
  { echo "fresh-root: apt-get install make failed in the root" >&2; exit 1; }
echo "fresh-root: make demo, then make test, in the root"
rc=0
chroot "$dir" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 TERM=dumb /bin/bash -c 'cd /work/tally && make demo >/tmp/demo.log 2>&1 || { cat /tmp/demo.log; echo "fresh-root: make demo failed"; exit 1; }
tail -3 /tmp/demo.log; make test' || rc=$?
echo "fresh-root: make demo and make test took $((SECONDS - t1)) s; the whole step $((SECONDS - t0)) s"
[ $rc -eq 0 ] || { echo "fresh-root: failed (exit $rc)" >&2; exit $rc; }
echo "fresh-root: passed"
