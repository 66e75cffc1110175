#!/bin/bash
# run-in-vm.sh - boot a throw-away Debian bookworm VM (systemd PID 1, cgroup v2, Slurm packages)
#                and run a script inside it; prints the script's output, exits with its exit code.
#
# usage: run-in-vm.sh [-i] SCRIPT [FILE...]
#   SCRIPT   bash script run as root inside the guest (cwd = /host, the 9p share)
#   FILE...  extra files (e.g. your .deb) copied into the share, visible in the guest as /host/<name>
#   -i       interactive: serial console on your terminal (autologin root), no script run
#
# env: VM_MEM (MiB, default 2048)  VM_CPUS (default 2)  VM_TIMEOUT (s, default 600)
#      VM_ACCEL=tcg|kvm (default tcg: /dev/kvm on this host is PVM and cannot run a stock kernel)
#      VM_KEEP=1 keep the run dir (console.log, qemu.log, share/) and print its path
#      VM_CACHE (default ${TMPDIR:-/tmp}/vmnode-cache)
#
# Caches: debootstrap tree (keyed on suite+package list), customized image+kernel+initrd
# (keyed on that + guest/customize.sh + guest/vm-runner*). Every run boots the cached image
# with snapshot=on, so the base image is never modified and each run starts clean.
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${VM_CACHE:-/var/tmp/gpufence-vm-cache}
SUITE=bookworm
MIRROR=${VM_MIRROR:-$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null)}  # the machine's own Debian mirror
PKGS=systemd,systemd-sysv,udev,dbus,iproute2,kmod,procps,util-linux,linux-image-amd64,munge,slurmd,slurmctld,slurm-client,bpftool,less,strace,python3-minimal
IMG_SIZE=4G
MEM=${VM_MEM:-2048}; CPUS=${VM_CPUS:-2}; TIMEOUT=${VM_TIMEOUT:-600}; ACCEL=${VM_ACCEL:-tcg}

INTERACTIVE=0
if [ "${1:-}" = "-i" ]; then INTERACTIVE=1; shift; fi
if [ $INTERACTIVE = 0 ] && [ $# -lt 1 ]; then sed -n '2,12p' "$0" >&2; exit 2; fi

log() { echo "[run-in-vm $(date +%T)] $*" >&2; }
need() { command -v "$1" >/dev/null || { log "installing $2"; DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$2" >/dev/null; }; }
need qemu-system-x86_64 qemu-system-x86
need debootstrap debootstrap
need mkfs.ext4 e2fsprogs

mkdir -p "$CACHE/debs"
exec 9>"$CACHE/.lock"; flock 9          # serialize image builds sharing one cache

# ---- stage 1: debootstrap (cached) -------------------------------------------------------
K1=$(printf '%s\n' "$SUITE" "$MIRROR" "$PKGS" | sha256sum | cut -c1-12)
BASE=$CACHE/base-$K1
if [ ! -e "$BASE/.done" ]; then
  log "stage 1: debootstrap $SUITE -> $BASE"
  rm -rf "$BASE"
  debootstrap --variant=minbase --cache-dir="$CACHE/debs" --include="$PKGS" \
      "$SUITE" "$BASE" "$MIRROR" > "$CACHE/debootstrap-$K1.log" 2>&1 \
      || { tail -20 "$CACHE/debootstrap-$K1.log" >&2; exit 1; }
  touch "$BASE/.done"
fi

# ---- stage 2: customize + ext4 image + kernel/initrd (cached) ----------------------------
K2=$( (echo "$K1 $IMG_SIZE"; cat "$HERE"/guest/*) | sha256sum | cut -c1-12)
IMG=$CACHE/img-$K2
if [ ! -e "$IMG/.done" ]; then
  log "stage 2: customize + mkfs.ext4 -d -> $IMG"
  rm -rf "$IMG" "$IMG.tree"; mkdir -p "$IMG"
  cp -a "$BASE" "$IMG.tree"; rm -f "$IMG.tree/.done"
  "$HERE/guest/customize.sh" "$IMG.tree" "$HERE/guest" >&2
  cp "$IMG.tree"/boot/vmlinuz-* "$IMG/vmlinuz"
  cp "$IMG.tree"/boot/initrd.img-* "$IMG/initrd.img"
  mkfs.ext4 -q -F -L vmroot -d "$IMG.tree" "$IMG/root.img" "$IMG_SIZE"
  rm -rf "$IMG.tree"
  touch "$IMG/.done"
  for old in "$CACHE"/img-*; do [ "$old" = "$IMG" ] || rm -rf "$old"; done   # prune stale images
fi

exec 9>&-                               # image ready: let concurrent runs boot in parallel

# ---- stage 3: boot ----------------------------------------------------------------------
case $ACCEL in
  # kvm: for hosts with real VT-x/AMD-V. On this kind of host (/dev/kvm is a paravirtual module) it does NOT boot a
  # stock kernel (see report); there -cpu host also needs VM_CPU=host,-arch-capabilities.
  kvm) ACC=(-accel kvm -cpu "${VM_CPU:-host}") ;;
  *)   ACC=(-accel tcg,thread=multi,tb-size=256 -cpu max) ;;
esac
APPEND="console=ttyS0 root=/dev/vda rw quiet loglevel=3 panic=-1 systemd.show_status=0 net.ifnames=0 mitigations=off"
QEMU=(qemu-system-x86_64 "${ACC[@]}" -m "$MEM" -smp "$CPUS" -nographic -nodefaults -no-reboot
      -kernel "$IMG/vmlinuz" -initrd "$IMG/initrd.img"
      -drive "file=$IMG/root.img,format=raw,if=virtio,snapshot=on,cache=unsafe"
      -device virtio-rng-pci)

if [ $INTERACTIVE = 1 ]; then
  log "interactive console (Ctrl-A x to quit qemu)"
  exec "${QEMU[@]}" -serial mon:stdio -append "$APPEND"
fi

RUN=$(mktemp -d "$CACHE/run.XXXXXX"); SHARE=$RUN/share; mkdir "$SHARE"
cleanup() { [ -n "${QPID:-}" ] && kill "$QPID" 2>/dev/null || true
            if [ "${VM_KEEP:-0}" = 1 ]; then log "run dir kept: $RUN (console.log, qemu.log, share/)"; else rm -rf "$RUN"; fi; }
trap cleanup EXIT
cp "$1" "$SHARE/script.sh"; shift
# Every guest script may source the fake node's setup (guest/fake-node.sh).
cp "$(dirname "$0")/guest/fake-node.sh" "$SHARE/fake-node.sh"
for f in "$@"; do cp -a "$f" "$SHARE/"; done

T0=$(date +%s.%N)
log "booting ($ACCEL, ${CPUS} vCPU, ${MEM} MiB)"
"${QEMU[@]}" -serial "file:$RUN/console.log" -append "$APPEND vmrunner=1 systemd.mask=serial-getty@ttyS0.service" \
   -virtfs "local,path=$SHARE,mount_tag=hostshare,security_model=none,id=hostshare" \
   </dev/null >"$RUN/qemu.log" 2>&1 &
QPID=$!
DEADLINE=$(( $(date +%s) + TIMEOUT ))
while kill -0 "$QPID" 2>/dev/null; do
  if [ "$(date +%s)" -ge "$DEADLINE" ]; then log "TIMEOUT after ${TIMEOUT}s, killing qemu"; kill "$QPID"; break; fi
  HWM=$(awk '/VmHWM/{print $2}' /proc/$QPID/status 2>/dev/null || true); [ -n "$HWM" ] && PEAK=$HWM
  sleep 0.5
done
wait "$QPID" 2>/dev/null || true; QPID=
T1=$(date +%s.%N)

[ -f "$SHARE/output.log" ] && cat "$SHARE/output.log"
if [ -f "$SHARE/exit_code" ]; then
  RC=$(cat "$SHARE/exit_code")
  log "guest boot state: $(head -1 "$SHARE/.boot_state" 2>/dev/null) at $(sed -n 2p "$SHARE/.boot_state" 2>/dev/null)s guest uptime; script rc=$RC; qemu peak RSS $(( ${PEAK:-0} / 1024 )) MiB; wall $(echo "$T1 - $T0" | bc 2>/dev/null || python3 -c "print(round($T1-$T0,1))")s"
  exit "$RC"
fi
log "no exit code from guest; console tail:"; tail -40 "$RUN/console.log" >&2; cat "$RUN/qemu.log" >&2
exit 125
