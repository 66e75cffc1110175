#!/bin/bash
# nvidia.sh OUTDIR: AutoDetect=nvidia (24.11+) on a fake /proc/driver/nvidia, in gfroot.
set -uo pipefail
OUT=$1; P=/var/tmp/gfg-slurmdg; H=/var/tmp/slurmdg
declare -A ROOT=([24.11]=$H/roots/trixie [26.05]=$H/roots/sid)
FD=$H/fakedriver; rm -rf $FD
# PCI bus order (what the driver lists) differs from the minors.
minors=(2 3 0 1)
for i in 0 1 2 3; do
  bus=$(printf '0000:%02x:00.0' $((0x18+i)))
  mkdir -p $FD/proc-driver/nvidia/gpus/$bus $FD/pci-drivers/nvidia/$bus
  printf 'Model: \t\t Tesla T4\nIRQ:   \t\t 100\nGPU UUID: \t GPU-0000%04x-6f2e-4a1b-9c3d-5e8f7a6b4c%02x\nVideo BIOS: \t 90.04.38.00.03\nBus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\nBus Location: \t %s\nDevice Minor: \t %d\nGPU Excluded:\t No\n' ${minors[$i]} ${minors[$i]} $bus ${minors[$i]} > $FD/proc-driver/nvidia/gpus/$bus/information
  echo 0-1 > $FD/pci-drivers/nvidia/$bus/local_cpulist
done
for rel in ${RELS:-24.11 26.05}; do
  l=autodetect-nvidia; o=$OUT/$rel/$l; mkdir -p $o; R=${ROOT[$rel]}; D=$P/$l
  cp $H/rec/layout.sh $R/layout.sh
  chroot $R /bin/bash /layout.sh $D plain
  echo "AutoDetect=nvidia" > $R$D/etc/gres.conf
  sed -i 's/Gres=gpu:4/Gres=gpu:tesla_t4:4/' $R$D/etc/slurm.conf
  dn=(); for m in 0 1 2 3; do dn+=(-devnode nvidia$m:195:$m); done
  cmd=(/usr/sbin/slurmd -G -f $D/etc/slurm.conf -N gfnode)
  env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C timeout 60 $H/bin/gfroot -root $R -bind $H/munge "${dn[@]}" -overlay $FD/proc-driver:/proc/driver -overlay $FD/pci-drivers:/sys/bus/pci/drivers -- "${cmd[@]}" >$o/stdout 2>$o/stderr; rc=$?
  echo $rc > $o/rc; cp $R$D/etc/*.conf $o/; rm -f $o/cgroup.conf
  mkdir -p $o/proc-driver; cp -r $FD/proc-driver/nvidia $o/proc-driver/
  printf '%s\n%s\n' "$(chroot $R /usr/sbin/slurmd -V)" "${cmd[*]}" > $o/command
  echo "$rel $l rc=$rc $(grep -c 'Gres Name=' $o/stderr) lines"; cat $o/stderr
done
