#!/bin/sh
# "Outside" for the CPython compatibility test (tests/integration/process/cpython_compat_test.cpp):
# runs DRIVER with the image's own python3 in the image's unpacked root, as an ordinary
# process of the host would: a chroot into a read-only bind of ROOTFS (the image is never
# written), the host's /dev and a fresh /proc and read-only /sys, a tmpfs /tmp, the host's
# network, no cgroup or seccomp of ours, as user nobody (65534) with HOME=/tmp/home.
# Needs root (mount namespace, chroot). Usage: cpython_outside.sh ROOTFS DRIVER
set -eu
[ $# -eq 2 ] || { echo "usage: $0 ROOTFS DRIVER" >&2; exit 2; }
[ -x "$1/usr/bin/python3" ] || { echo "$0: no $1/usr/bin/python3" >&2; exit 2; }
exec unshare --mount --propagation private --fork /bin/sh -eu -c '
m=$(mktemp -d)
mount --bind "$1" "$m"
mount -o remount,bind,ro "$m"
mount -t proc proc "$m/proc"
mount --rbind /dev "$m/dev"
mount -t sysfs -o ro sysfs "$m/sys"
mount -t tmpfs -o mode=1777 tmpfs "$m/tmp"
mkdir -m 0777 "$m/tmp/home"
cp "$2" "$m/tmp/driver.py"
chmod 0644 "$m/tmp/driver.py"
cd /
exec chroot "$m" /usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups \
  /usr/bin/env -i HOME=/tmp/home PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
  /usr/bin/python3 -I /tmp/driver.py' sh "$1" "$2"
