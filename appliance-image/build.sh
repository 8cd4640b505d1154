#!/usr/bin/env bash
# Builds the Switchyard appliance: a bootable raw disk image (MBR, extlinux, a minimal Debian
# root with a kernel and systemd, the switchyard package, and an empty data partition) plus the
# switchyard .deb that installs and upgrades it. One command, as root:
#
#   appliance-image/build.sh [--binary PATH] [--out DIR] [--version V] [--arch amd64|arm64]
#                            [--data-size SIZE] [--package-only] [--console-log]
#
# Output in DIR (default appliance-image/out): switchyard-appliance-<arch>.img (sparse raw disk),
# switchyard_<version>_<arch>.deb, and manifest.txt (sizes and checksums). --console-log copies the
# journal to the serial console (tests, bring-up). See README.md.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
binary=$repo/target/release/switchyard
out=$here/out
arch=amd64
version=""
data_size=1G
package_only=false
console_log=false
suite=bookworm
mirror=${SWITCHYARD_APPLIANCE_MIRROR:-http://deb.debian.org/debian}
cache=${SWITCHYARD_APPLIANCE_CACHE:-/var/cache/switchyard-appliance}

# standard output carries only the image path (the last line); everything else goes to stderr
exec 3>&1 1>&2

die() { echo "build.sh: $*" >&2; exit 1; }
log() { echo "build.sh: $*" >&2; }

while (($#)); do
  case $1 in
    --binary) binary=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --version) version=$2; shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    --data-size) data_size=$2; shift 2 ;;
    --package-only) package_only=true; shift ;;
    --console-log) console_log=true; shift ;;
    -h|--help) sed -n '2,13p' "$0" >&3; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

case $arch in
  amd64) kernel=linux-image-amd64; elf=x86-64 ;;
  arm64) kernel=linux-image-arm64; elf=aarch64 ;;
  *) die "--arch must be amd64 or arm64, not $arch" ;;
esac
[ -x "$binary" ] || die "no switchyard binary at $binary (cargo build --release -p switchyard, or --binary PATH)"
file -b "$binary" | grep -q "$elf" ||
  die "$binary is not an $arch binary ($(file -b "$binary" | cut -d, -f1-2)); see README.md for the cross build"
if [ -z "$version" ]; then
  crate=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)
  rev=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo local)
  version="${crate:-0.0.0}+g$rev"
fi
[ "$(id -u)" = 0 ] || die "run as root (the image build mounts its root file system and chroots)"
need=(dpkg-deb file)
$package_only || need+=(mmdebstrap mkfs.ext4 sfdisk extlinux losetup mount chroot)
for cmd in "${need[@]}"; do
  command -v "$cmd" >/dev/null || die "$cmd is missing (apt-get install mmdebstrap e2fsprogs fdisk extlinux syslinux-common)"
done

mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/switchyard-appliance.XXXXXX")
loop=""
cleanup() {
  set +e
  mountpoint -q "$work/mnt" 2>/dev/null && umount "$work/mnt"
  [ -n "$loop" ] && losetup -d "$loop"
  rm -rf "$work"
}
trap cleanup EXIT

# ---------------------------------------------------------------- the package
deb=$out/switchyard_${version}_${arch}.deb
pkg=$work/pkg
install -d "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/lib/systemd/system" "$pkg/usr/lib/switchyard" \
  "$pkg/etc/switchyard" "$pkg/usr/share/doc/switchyard"
# stripped: the appliance carries no debug information (objcopy knows every ELF architecture)
objcopy --strip-all "$binary" "$pkg/usr/bin/switchyard"
install -m 0644 "$here"/package/units/*.service "$pkg/lib/systemd/system/"
install -m 0755 "$here/package/firstboot" "$pkg/usr/lib/switchyard/firstboot"
install -m 0644 "$here/package/config/server.yaml" "$pkg/etc/switchyard/server.yaml"
install -m 0644 "$here/README.md" "$pkg/usr/share/doc/switchyard/README.appliance.md"
install -m 0755 "$here/package/postinst" "$here/package/prerm" "$pkg/DEBIAN/"
echo /etc/switchyard/server.yaml > "$pkg/DEBIAN/conffiles"
cat > "$pkg/DEBIAN/control" <<EOF
Package: switchyard
Version: $version
Architecture: $arch
Maintainer: Switchyard developers <switchyard@localhost>
Depends: adduser, init-system-helpers
Installed-Size: $(du -sk "$pkg" | cut -f1)
Section: net
Priority: optional
Description: forward proxy gateway, VPN client and edge services in one binary
 switchyard server (HTTP, CONNECT and SOCKS5 proxy with domain routing to direct, upstream
 proxy, WireGuard, OpenVPN and provider backends, LAN cache, management API) and the client,
 pkgcache, inventory and subtitles services, as systemd units of an appliance.
EOF
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$deb" >/dev/null
log "package $deb ($(du -h "$deb" | cut -f1))"
$package_only && exit 0
if [ "$arch" != amd64 ]; then
  # a Raspberry Pi boots from a FAT firmware partition (raspi-firmware, config.txt), not extlinux
  die "disk images are built for amd64 only; the $arch package is $deb (README.md: aarch64)"
fi

# ---------------------------------------------------------------- the root file system
# The Debian base is cached by its inputs (a rebuild only repackages switchyard): minbase, a
# kernel, systemd, networkd for DHCP on the first NIC, no recommends, no docs, man pages or
# locales.
packages="systemd-sysv,udev,kmod,$kernel,iproute2,e2fsprogs,adduser,init-system-helpers,netbase,procps,ca-certificates"
key=$(printf '%s\n' "$suite" "$arch" "$mirror" "$packages" "base-v1" | sha256sum | cut -c1-16)
base=$cache/base-$arch-$key.tar
mkdir -p "$cache"
if [ ! -s "$base" ]; then
  log "building the Debian $suite base for $arch with mmdebstrap (cached in $base)"
  mmdebstrap --variant=minbase --arch="$arch" --include="$packages" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
    --format=tar "$suite" "$base.tmp" "$mirror"
  mv "$base.tmp" "$base"
fi

root=$work/root
mkdir -p "$root"
tar -C "$root" --numeric-owner -xf "$base"
# kernel drivers an appliance box never needs (sound, graphics, cameras, radios): a third of
# the modules' size; the initramfs was built before and keeps its own copies
kver=$(ls "$root/lib/modules" | head -1)
for d in sound drivers/gpu drivers/media drivers/net/wireless drivers/infiniband drivers/staging \
         drivers/bluetooth net/bluetooth drivers/isdn drivers/iio; do
  rm -rf "$root/lib/modules/$kver/kernel/$d"
done
chroot "$root" depmod "$kver"

mkdir -p "$root/var/lib/switchyard"
cp "$deb" "$root/tmp/switchyard.deb"
chroot "$root" dpkg -i /tmp/switchyard.deb >/dev/null
rm "$root/tmp/switchyard.deb"

cat > "$root/etc/fstab" <<'EOF'
# the root is replaced by upgrades; the data partition (caches, databases, keys, secrets) is not
LABEL=syroot  /                    ext4  defaults,noatime,errors=remount-ro  0 1
LABEL=sydata  /var/lib/switchyard  ext4  defaults,noatime,nofail,x-systemd.device-timeout=30s  0 2
EOF
echo switchyard > "$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\tswitchyard\n::1\tlocalhost ip6-localhost ip6-loopback\n' > "$root/etc/hosts"
cat > "$root/etc/systemd/network/20-wired.network" <<'EOF'
[Match]
Name=en* eth*

[Network]
DHCP=yes
EOF
chroot "$root" systemctl enable systemd-networkd.service >/dev/null 2>&1
# minbase has no dbus (no logind): Ctrl-Alt-Del (a key, or QMP send-key) powers the box off
ln -sf /lib/systemd/system/poweroff.target "$root/etc/systemd/system/ctrl-alt-del.target"
# no password logins: the appliance is managed through its API; the console shows the token
chroot "$root" passwd -l root >/dev/null
echo "switchyard $version" > "$root/etc/switchyard-release"
if $console_log; then
  # for tests and bring-up: the journal (every unit's log) on the serial console
  mkdir -p "$root/etc/systemd/journald.conf.d"
  printf '[Journal]\nForwardToConsole=yes\nTTYPath=/dev/ttyS0\nMaxLevelConsole=info\n' \
    > "$root/etc/systemd/journald.conf.d/console.conf"
fi

mkdir -p "$root/boot/extlinux"
cat > "$root/boot/extlinux/extlinux.conf" <<'EOF'
DEFAULT switchyard
PROMPT 0
TIMEOUT 1
LABEL switchyard
  LINUX /vmlinuz
  INITRD /initrd.img
  APPEND root=LABEL=syroot ro console=tty0 console=ttyS0,115200n8 quiet
EOF

# ---------------------------------------------------------------- the disk
# extlinux (syslinux 6.04) reads ext4 without the 64bit and metadata_csum features
used_mb=$(du -sm "$root" | cut -f1)
root_mb=$(( used_mb * 13 / 10 + 384 ))
data_mb=$(numfmt --from=iec "$data_size" | awk '{print int($1 / 1048576)}')
((data_mb >= 64)) || die "--data-size must be at least 64M"
log "root file system: ${used_mb} MiB used, partition ${root_mb} MiB; data partition ${data_mb} MiB"
mkfs.ext4 -q -F -L syroot -O ^64bit,^metadata_csum -d "$root" "$work/root.ext4" "${root_mb}M"
mkfs.ext4 -q -F -L sydata "$work/data.ext4" "${data_mb}M"

image=$out/switchyard-appliance-$arch.img
rm -f "$image"
truncate -s $(( (1 + root_mb + data_mb) * 1048576 )) "$image"
sfdisk -q "$image" <<EOF
label: dos
start=1MiB, size=${root_mb}MiB, type=83, bootable
start=$(( 1 + root_mb ))MiB, size=${data_mb}MiB, type=83
EOF
dd if="$work/root.ext4" of="$image" bs=1M seek=1 conv=notrunc,sparse status=none
dd if="$work/data.ext4" of="$image" bs=1M seek=$(( 1 + root_mb )) conv=notrunc,sparse status=none
mbr=/usr/lib/syslinux/mbr/mbr.bin
[ -f "$mbr" ] || mbr=/usr/lib/EXTLINUX/mbr.bin
dd if="$mbr" of="$image" bs=440 count=1 conv=notrunc status=none

mkdir -p "$work/mnt"
loop=$(losetup --find --show --offset 1048576 --sizelimit $(( root_mb * 1048576 )) "$image")
mount "$loop" "$work/mnt"
extlinux --install "$work/mnt/boot/extlinux" >/dev/null 2>&1
umount "$work/mnt"
losetup -d "$loop"
loop=""

{
  echo "switchyard $version ($arch)"
  echo "binary (stripped): $(stat -c %s "$pkg/usr/bin/switchyard") bytes"
  echo "package: $(basename "$deb") $(stat -c %s "$deb") bytes sha256 $(sha256sum "$deb" | cut -d' ' -f1)"
  echo "image: $(basename "$image") $(stat -c %s "$image") bytes (sparse, $(du -k "$image" | cut -f1) KiB allocated)"
  echo "root partition: ${root_mb} MiB (${used_mb} MiB used); data partition: ${data_mb} MiB"
} > "$out/manifest.txt"
cat "$out/manifest.txt"
echo "$image" >&3
