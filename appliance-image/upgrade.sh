#!/usr/bin/env bash
# Upgrades an appliance disk offline — an image file, or the SD card / disk of a box that is
# switched off — by installing a newer switchyard package into its root partition. The data
# partition (caches, databases, keys, the API token) is never mounted, let alone changed.
#
#   appliance-image/upgrade.sh DISK PACKAGE.deb [--new-config]
#
# By default an operator-changed /etc/switchyard/server.yaml is kept (dpkg --force-confold);
# --new-config replaces it with the package's (--force-confnew). A box that is running upgrades
# itself with the same package: `dpkg -i switchyard_<version>_<arch>.deb` (the package restarts
# the running units). Prints "switchyard OLD -> NEW".
set -euo pipefail

die() { echo "upgrade.sh: $*" >&2; exit 1; }

(($# >= 2)) || die "usage: upgrade.sh DISK PACKAGE.deb [--new-config]"
disk=$1
deb=$2
conf=--force-confold
case ${3:-} in
  "") ;;
  --new-config) conf=--force-confnew ;;
  *) die "unknown option $3" ;;
esac
[ "$(id -u)" = 0 ] || die "run as root (it mounts the disk's root partition)"
[ -e "$disk" ] || die "no disk or image at $disk"
[ -f "$deb" ] || die "no package at $deb"
for cmd in sfdisk losetup mount chroot dpkg-deb; do
  command -v "$cmd" >/dev/null || die "$cmd is missing"
done
[ "$(dpkg-deb -f "$deb" Package)" = switchyard ] || die "$deb is not a switchyard package"

# the root partition is the first one (build.sh), labelled syroot
read -r start size < <(sfdisk -J "$disk" | python3 -c '
import json, sys
p = json.load(sys.stdin)["partitiontable"]
sector = p.get("sectorsize", 512)
first = p["partitions"][0]
print(first["start"] * sector, first["size"] * sector)')
work=$(mktemp -d "${TMPDIR:-/tmp}/switchyard-upgrade.XXXXXX")
loop=""
cleanup() {
  set +e
  mountpoint -q "$work/mnt" && umount "$work/mnt"
  [ -n "$loop" ] && losetup -d "$loop"
  rm -rf "$work"
}
trap cleanup EXIT
loop=$(losetup --find --show --offset "$start" --sizelimit "$size" "$disk")
[ "$(blkid -o value -s LABEL "$loop")" = syroot ] || die "the first partition of $disk is not an appliance root (label syroot)"
mkdir "$work/mnt"
mount "$loop" "$work/mnt"

image_arch=$(chroot "$work/mnt" dpkg --print-architecture)
[ "$(dpkg-deb -f "$deb" Architecture)" = "$image_arch" ] || die "$deb is for $(dpkg-deb -f "$deb" Architecture), the disk is $image_arch"
old=$(chroot "$work/mnt" dpkg-query -W -f '${Version}' switchyard 2>/dev/null || echo none)
cp "$deb" "$work/mnt/tmp/switchyard-upgrade.deb"
chroot "$work/mnt" dpkg -i "$conf" /tmp/switchyard-upgrade.deb >/dev/null
rm "$work/mnt/tmp/switchyard-upgrade.deb"
new=$(chroot "$work/mnt" dpkg-query -W -f '${Version}' switchyard)
echo "switchyard $new" > "$work/mnt/etc/switchyard-release"
umount "$work/mnt"
echo "switchyard $old -> $new"
