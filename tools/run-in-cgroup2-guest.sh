#!/usr/bin/env bash
# Runs the process backend's integration tests inside a QEMU microvm guest whose only cgroup
# hierarchy is cgroup2 (memory, pids, cpu enabled for subtrees), as root with CI=true
# SANDBOX_MUST_WORK=1: the pure cgroup v2 test bed. TESTBED_AS=user runs them as an
# unprivileged user (uid/gid 1000) that owns a delegated subtree instead, as
# tools/run-unprivileged.sh does on this host. This project's build hosts are cgroup
# v1-hybrid; production hosts are pure v2, and this is where the library's v2 path runs for
# real (docs/operations.md, "Pure cgroup v2 test bed").
#
#   tools/run-in-cgroup2-guest.sh <build dir> [test args…]
#       e.g. tools/run-in-cgroup2-guest.sh build/dev "[limits]"
#
# Exit status: the tests' own (128 + signal when killed), or 125 when the test bed itself
# failed (no kernel, the guest never became ready, no status came back, the status port held
# anything but the bed's own lines) — the message says which.
#
# The guest: Debian's cloud kernel from tools/fetch-guest-kernel.sh, TCG (TESTBED_ACCEL=kvm
# where /dev/kvm works), an initramfs with tests/guest_testbed's static init, and one read-only erofs disk
# holding exactly what the tests need: the test binary and the closure of its shared libraries
# (ldd), sandboxctl, the tests' helpers, a few /etc files, and the python3, node, tools and mcp
# images of the image store (unpacked rootfs plus manifest and config; layers are not needed).
# The disk is cached in <build dir>/guest-testbed/ by a hash of all its inputs. The tests'
# output streams to this terminal (the guest's serial console); the exit status comes back on
# a virtio-serial port of its own that the tests cannot reach.
#
# Environment:
#   TESTBED_PROGRAM         the command run in the guest (default <build>/tests/sandbox_process_tests)
#   TESTBED_TIMEOUT         seconds for the guest run from its ready line (default: calibrated);
#                           the guest's watchdog fires a quarter (at most 60 s) earlier
#   TESTBED_BOOT_TIMEOUT    seconds until the guest reports ready (default 180)
#   TESTBED_AS              root (default) or user: uid 1000 with /sys/fs/cgroup/agent-sandbox-ci
#                           delegated (runs under agent-sandbox-ci/runs)
#   TESTBED_ACCEL           tcg (default) or kvm
#   TESTBED_MEM_MIB         guest RAM (default 3072); TESTBED_CPUS: vCPUs (default 2)
#   TESTBED_IMAGES          runtime images put on the disk (default "python3 node tools mcp")
#   TESTBED_REQUIRE_CGROUP_PARENT=1   fail unless the runtime made its parent cgroup with the
#                           memory and pids controllers in the guest (CI sets it)
#   SANDBOX_KERNEL_DIR, SANDBOX_IMAGE_DIR   the kernel and image stores (as elsewhere)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() {
  echo "run-in-cgroup2-guest: $*" >&2
  exit 125
}
[ $# -ge 1 ] || die "usage: $0 <build dir> [test args…]"
[ -d "$1" ] || die "build dir $1: not a directory"
BUILD=$(cd "$1" && pwd)
shift
[ "$(id -u)" = 0 ] || die "must run as root (the image store's rootfs and mkfs.erofs need it)"

KERNEL=${SANDBOX_KERNEL_DIR:-/var/lib/agent-sandbox/microvm/kernel}/current
IMAGES=${SANDBOX_IMAGE_DIR:-/var/lib/agent-sandbox/images}
PROGRAM=${TESTBED_PROGRAM:-$BUILD/tests/sandbox_process_tests}
INIT=$BUILD/tests/guest_testbed/testbed_init
# Numbers from the environment: positive integers, checked before anything is built.
number() {  # number NAME DEFAULT
  local v=${!1:-$2}
  [[ $v =~ ^[1-9][0-9]{0,5}$ ]] || die "$1 must be a positive integer, not '$v'"
  echo "$v"
}
# The whole run's deadline. Given: exactly that. Default: calibrated on this host at this run,
# since everything in the guest is emulated (TCG) and so as slow as this host is now: the
# guest's own boot to TESTBED-READY (kernel, modules, root) is measured, and the run may take
# 150 times that, at least 600 s (printed). The guest's own watchdog fires WATCHDOG_MARGIN s
# earlier by the same rule (its boot time is at most ours): it prints what hangs before the
# bed fails, where this script's deadline can only kill QEMU.
# Once the watchdog has fired (TESTBED-WATCHDOG on the status port), its dump gets
# WATCHDOG_GRACE s more: on a slow or loaded host the dump through the emulated serial
# console once outlasted the margin, and the bed died saying nothing of why (seen in CI).
TIMEOUT_GIVEN=${TESTBED_TIMEOUT:+1}
TIMEOUT_MIN=600
TIMEOUT=$(number TESTBED_TIMEOUT $TIMEOUT_MIN)
WATCHDOG_MARGIN=$((TIMEOUT / 4 < 60 ? TIMEOUT / 4 : 60))
WATCHDOG_GRACE=60
BOOT_TIMEOUT=$(number TESTBED_BOOT_TIMEOUT 180)
MEM=$(number TESTBED_MEM_MIB 3072)
CPUS=$(number TESTBED_CPUS 2)
# TCG unless asked: a /dev/kvm that opens is not yet one that runs a guest (this project's
# build hosts have one that fails at the first MSR write).
CPU=max
case ${TESTBED_ACCEL:-tcg} in
  tcg) ACCEL=tcg,thread=multi,tb-size=256 ;;
  kvm) ACCEL=kvm CPU=host ;;
  *) die "TESTBED_ACCEL: tcg or kvm, not '${TESTBED_ACCEL}'" ;;
esac
case ${TESTBED_AS:-root} in
  root | user) AS=${TESTBED_AS:-root} ;;
  *) die "TESTBED_AS: root or user, not '${TESTBED_AS}'" ;;
esac
read -r -a WANT_IMAGES <<<"${TESTBED_IMAGES:-python3 node tools mcp}"
PY=/usr/bin/python3

for tool in qemu-system-x86_64 mkfs.erofs cpio ldd strip sha256sum; do
  command -v "$tool" >/dev/null || die "$tool is not installed (tools/setup.sh installs it)"
done
[ -x "$PY" ] || die "$PY is not installed (tools/setup.sh installs it)"
for f in vmlinuz modules/order; do
  [ -f "$KERNEL/$f" ] || die "no guest kernel: $KERNEL/$f is missing (run tools/fetch-guest-kernel.sh)"
done
[[ $PROGRAM = /* ]] || die "TESTBED_PROGRAM must be an absolute path, not '$PROGRAM'"
[ -x "$PROGRAM" ] || die "test program $PROGRAM is not built (cmake --build $BUILD)"
[ -x "$INIT" ] || die "$INIT is not built (cmake --build $BUILD --target testbed_init)"
[ -f "$IMAGES/layout/index.json" ] || die "no image store at $IMAGES (run tools/setup.sh)"

CACHE=$BUILD/guest-testbed
mkdir -p "$CACHE"
RUN=$(mktemp -d "$CACHE/run-XXXXXX")
QEMU_PID=
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
  if [ -n "$QEMU_PID" ]; then
    kill -KILL "$QEMU_PID" 2>/dev/null || true
    wait "$QEMU_PID" 2>/dev/null || true  # reaped here: PID 1 of a container may never reap it
  fi
  rm -rf "$RUN"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- 1. What goes on the disk ---------------------------------------------------------------
# Executables at the paths compiled into the tests (SANDBOXCTL_PATH, SANDBOX_LINGER_RACE_PATH,
# SANDBOX_TEST_HELPERS_DIR), so the tests find them in the guest where they are on the host.
# The process tests and the bed's probe are always there, so that the self-test and the tests
# share one cached disk.
EXES=("$PROGRAM")
for f in "$BUILD/tests/sandbox_process_tests" "$BUILD/bin/sandboxctl" \
  "$BUILD/tests/sandbox_linger_race" "$BUILD/tests/guest_testbed/testbed_probe"; do
  [ -x "$f" ] && [ "$f" != "$PROGRAM" ] && EXES+=("$f")
done
DIRS=()
[ -d "$ROOT/tests/helpers" ] && DIRS+=("$ROOT/tests/helpers")
ETC=()
for f in /etc/passwd /etc/group /etc/nsswitch.conf /etc/hosts; do
  [ -f "$f" ] && ETC+=("$f")
done
# The shared-library closure of every executable (a static one has none: ldd says so).
LIBS=()
for e in "${EXES[@]}"; do
  while read -r lib; do
    [ -n "$lib" ] && LIBS+=("$lib")
  done < <(ldd "$e" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' || true)
done
mapfile -t LIBS < <(printf '%s\n' "${LIBS[@]}" | sort -u | sed '/^$/d')
# The images: the current digest of each wanted runtime, its manifest and config blobs, and
# its unpacked rootfs (a rootfs is named by its manifest digest: its content is covered).
IMAGE_PLAN=$("$PY" - "$IMAGES" "${WANT_IMAGES[@]}" <<'EOF'
import json, os, sys
store, want = sys.argv[1], sys.argv[2:]
index = json.load(open(os.path.join(store, "layout", "index.json")))
keep, files = [], []
for name in want:
    m = [d for d in index.get("manifests", [])
         if d.get("annotations", {}).get("io.agent-sandbox.runtime") == name
         and d.get("annotations", {}).get("io.agent-sandbox.current") == "true"]
    if len(m) != 1:
        sys.exit(f"image '{name}' is not in the store {store} (run tools/setup.sh)")
    digest = m[0]["digest"]
    hexd = digest.split(":", 1)[1]
    if not os.path.isdir(os.path.join(store, "rootfs", hexd)):
        sys.exit(f"image '{name}' ({digest}) is not unpacked in {store}/rootfs")
    manifest = json.load(open(os.path.join(store, "layout", "blobs", "sha256", hexd)))
    keep.append(m[0])
    files += [hexd, manifest["config"]["digest"].split(":", 1)[1]]
    print("rootfs", hexd)
for f in files:
    print("blob", f)
index["manifests"] = keep
print("index", json.dumps(index, sort_keys=True))
EOF
) || die "cannot plan the images (see above)"

# --- 2. The disk, cached by a hash of its inputs ----------------------------------------------
KEY=$({
  echo "disk layout 1"  # raise when the staging below changes
  sha256sum "${EXES[@]}" "${LIBS[@]}" "${ETC[@]}"
  [ ${#DIRS[@]} -eq 0 ] || find "${DIRS[@]}" -type f -print0 | sort -z | xargs -0 -r sha256sum
  printf '%s\n' "$IMAGE_PLAN"
} | sha256sum | cut -c1-32)
DISK=$CACHE/root-$KEY.erofs
if [ ! -f "$DISK" ]; then
  echo "run-in-cgroup2-guest: building the guest disk ($DISK)" >&2
  STAGE=$RUN/stage
  mkdir -p "$STAGE"/{tmp,var/tmp,run,root,dev,proc,sys,etc,var/lib/agent-sandbox/blobs}
  mkdir -p "$STAGE/var/lib/agent-sandbox/images/layout/blobs/sha256" \
    "$STAGE/var/lib/agent-sandbox/images/rootfs"
  for e in "${EXES[@]}"; do
    mkdir -p "$STAGE$(dirname "$e")"
    strip --strip-debug -o "$STAGE$e" "$e" 2>/dev/null || cp -L "$e" "$STAGE$e"
  done
  for f in "${LIBS[@]}" "${ETC[@]}"; do
    mkdir -p "$STAGE$(dirname "$f")"
    cp -L "$f" "$STAGE$f"
  done
  for d in "${DIRS[@]}"; do
    mkdir -p "$STAGE$(dirname "$d")"
    cp -a "$d" "$STAGE$d"
  done
  IMG=$STAGE/var/lib/agent-sandbox/images
  cp "$IMAGES/layout/oci-layout" "$IMG/layout/"
  while read -r kind rest; do
    case $kind in
      rootfs) cp -al "$IMAGES/rootfs/$rest" "$IMG/rootfs/" 2>/dev/null ||
        cp -a "$IMAGES/rootfs/$rest" "$IMG/rootfs/" ;;
      blob) cp "$IMAGES/layout/blobs/sha256/$rest" "$IMG/layout/blobs/sha256/" ;;
      index) printf '%s\n' "$rest" >"$IMG/layout/index.json" ;;
    esac
  done <<<"$IMAGE_PLAN"
  mkfs.erofs --quiet "$RUN/disk.erofs" "$STAGE" >/dev/null || die "mkfs.erofs failed"
  rm -rf "$STAGE"
  # One disk per build dir: the previous one (other inputs) goes.
  find "$CACHE" -maxdepth 1 -name 'root-*.erofs' -delete
  mv "$RUN/disk.erofs" "$DISK"
fi

# --- 3. The initramfs: init, the modules in order, the command --------------------------------
INITRD=$RUN/initrd
mkdir -p "$INITRD"/{dev,proc,sys,newroot,modules,testbed}
cp "$INIT" "$INITRD/init"
while read -r m; do
  [ -z "$m" ] && continue
  [[ $m =~ ^[A-Za-z0-9_.-]+\.ko$ ]] || die "bad module name '$m' in $KERNEL/modules/order"
  cp "$KERNEL/modules/$m" "$INITRD/modules/"
  echo "$m" >>"$INITRD/modules/order"
done <"$KERNEL/modules/order"
printf '%s\0' "$PROGRAM" "$@" >"$INITRD/testbed/argv"
if [ "$AS" = user ]; then printf '1000:1000' >"$INITRD/testbed/user"; fi
if [ -n "$TIMEOUT_GIVEN" ]; then
  printf '%s 0 %s' "$TIMEOUT" "$WATCHDOG_MARGIN" >"$INITRD/testbed/watchdog"
else
  printf '%s 150 %s' "$TIMEOUT_MIN" "$WATCHDOG_MARGIN" >"$INITRD/testbed/watchdog"
fi
(cd "$INITRD" && find . | cpio --quiet -o -H newc -R 0:0) >"$RUN/initrd.cpio" ||
  die "cpio failed"

# --- 4. Boot ------------------------------------------------------------------------------------
# The guest's TSC rate is given, not measured: under TCG on a loaded host the kernel's PIT
# calibration fails, it marks the TSC unstable and hangs with no clock at all (seen here).
# TCG's TSC is the host's, so the host's rate is the right one: x86 Linux derives BogoMIPS
# from it (2 × TSC MHz), which, unlike "cpu MHz", does not move with frequency scaling.
TSC_KHZ=${TESTBED_TSC_KHZ:-$(awk -F: '/^bogomips/{printf "%d", $2 * 500; exit}' /proc/cpuinfo)}
[[ $TSC_KHZ =~ ^[1-9][0-9]{3,8}$ ]] || die "cannot tell the host's TSC rate (set TESTBED_TSC_KHZ)"
# The uncompressed kernel when the store has it (a direct PVH boot, as the microvm level's:
# about 0.85 s less under TCG), the bzImage otherwise.
BOOT_KERNEL=$KERNEL/vmlinuz
[ -f "$KERNEL/vmlinux" ] && BOOT_KERNEL=$KERNEL/vmlinux
STATUS=$RUN/status
: >"$STATUS"
echo "run-in-cgroup2-guest: booting ($ACCEL, ${MEM} MiB, $CPUS vCPUs, as $AS): $PROGRAM $*" >&2
qemu-system-x86_64 \
  -M microvm,x-option-roms=off,isa-serial=on -accel "$ACCEL" -cpu "$CPU" \
  -m "$MEM" -smp "$CPUS" -nodefaults -no-user-config -display none -no-reboot \
  -kernel "$BOOT_KERNEL" -initrd "$RUN/initrd.cpio" \
  -append "console=ttyS0 loglevel=3 panic=-1 reboot=t rdinit=/init edd=off pci=off cryptomgr.notests tsc_early_khz=$TSC_KHZ" \
  -chardev stdio,id=con,signal=off -serial chardev:con \
  -device virtio-serial-device \
  -chardev file,id=st,path="$STATUS" -device virtserialport,chardev=st,name=testbed.status \
  -drive file="$DISK",format=raw,if=none,readonly=on,id=d0 -device virtio-blk-device,drive=d0 \
  </dev/null &
QEMU_PID=$!
# Two deadlines: ready (boot + setup) and the whole run. On either, QEMU is killed (cleanup).
boot_deadline=$((SECONDS + BOOT_TIMEOUT))
run_deadline=$((SECONDS + TIMEOUT))
started_us=${EPOCHREALTIME//[!0-9]/}
ready=
dog=
while kill -0 "$QEMU_PID" 2>/dev/null; do
  if [ -z "$ready" ] && grep -q '^TESTBED-READY' "$STATUS"; then
    ready=$(((${EPOCHREALTIME//[!0-9]/} - started_us) / 1000))  # ms, ±0.5 s (the poll below)
    if [ -z "$TIMEOUT_GIVEN" ]; then
      TIMEOUT=$((ready * 150 / 1000))
      [ "$TIMEOUT" -ge "$TIMEOUT_MIN" ] || TIMEOUT=$TIMEOUT_MIN
    fi
    # Counted from here, as the guest's watchdog counts from the command's start: counted
    # from QEMU's start, a slow boot ate the watchdog's margin, and a given 40 s ended the
    # guest before its watchdog (30 s after an 8 s boot) had printed what hung (seen in CI).
    run_deadline=$((SECONDS + TIMEOUT))
    echo "run-in-cgroup2-guest: calibration: the guest was ready after ${ready} ms; run deadline ${TIMEOUT} s${TIMEOUT_GIVEN:+ (TESTBED_TIMEOUT)}" >&2
  fi
  if [ -z "$dog" ] && grep -q '^TESTBED-WATCHDOG' "$STATUS"; then
    dog=1
    run_deadline=$((SECONDS + WATCHDOG_GRACE))
    echo "run-in-cgroup2-guest: the guest's watchdog fired; its dump may take ${WATCHDOG_GRACE} s" >&2
  fi
  if ! grep -q '^TESTBED-' "$STATUS" && [ "$SECONDS" -ge "$boot_deadline" ]; then
    die "the guest did not report ready within ${BOOT_TIMEOUT} s (TESTBED_BOOT_TIMEOUT)"
  fi
  [ "$SECONDS" -lt "$run_deadline" ] || die "the guest ran past ${TIMEOUT} s (TESTBED_TIMEOUT)"
  # Powered off after its verdict but still running: give it a moment, then end it.
  if grep -q '^TESTBED-EXIT \|^TESTBED-FAIL ' "$STATUS"; then
    for _ in $(seq 20); do kill -0 "$QEMU_PID" 2>/dev/null || break; sleep 0.5; done
    break
  fi
  sleep 0.5
done
rc=0
kill -0 "$QEMU_PID" 2>/dev/null && kill -KILL "$QEMU_PID"
wait "$QEMU_PID" || rc=$?
QEMU_PID=

# --- 5. The verdict: exactly the bed's own lines, in order ---------------------------------------
mapfile -t lines <"$STATUS"
if [ ${#lines[@]} -ge 1 ] && [[ ${lines[-1]} == "TESTBED-FAIL "* ]]; then
  die "the test bed failed in the guest: ${lines[-1]#TESTBED-FAIL }"
fi
if [ ${#lines[@]} -ne 3 ] || [ "${lines[0]}" != TESTBED-READY ] ||
  [[ ! ${lines[1]} =~ ^TESTBED-CGROUP-PARENT\ [a-z\ ]+$ ]] ||
  [[ ! ${lines[2]} =~ ^TESTBED-EXIT\ ([0-9]{1,3})$ ]]; then
  die "no valid status from the guest (qemu exit $rc); the status port held: $(head -c 400 "$STATUS" | tr -c '[:print:]\n' '?')"
fi
code=${BASH_REMATCH[1]}
parent=${lines[1]#TESTBED-CGROUP-PARENT }
echo "run-in-cgroup2-guest: the runtime's parent cgroup in the guest enables: $parent" >&2
if [ "${TESTBED_REQUIRE_CGROUP_PARENT:-0}" = 1 ]; then
  for c in memory pids; do
    [[ " $parent " == *" $c "* ]] ||
      die "the tests did not make the runtime's cgroup with $c on cgroup2 (parent: $parent)"
  done
fi
echo "run-in-cgroup2-guest: the command exited with status $code" >&2
exit "$code"
