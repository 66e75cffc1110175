#!/bin/bash
# record.sh OUTDIR: runs slurmd -G of every release on every layout.
set -uo pipefail
OUT=$1; P=/var/tmp/gfg-slurmdg
H=/var/tmp/slurmdg
declare -A SRC=(
 [23.11]=/var/cache/gpufence-test/slurm/slurm-23.11.11-d70e3e50403965ed-r1/opt/slurm
 [24.05]=/var/cache/gpufence-test/slurm/slurm-24.05.8-b1b1549ee80fbcd2-r1/opt/slurm
 [25.11]=/var/cache/gpufence-test/slurm/slurm-25.11.7-f71f1e5f33a72e78-r1/opt/slurm)
declare -A ROOT=([24.11]=$H/roots/trixie [26.05]=$H/roots/sid)
LAYOUTS=${LAYOUTS:-plain multitype mig autodetect autodetect-links autodetect-mig autodetect-files}
RELS=${RELS:-22.05 23.11 24.05 24.11 25.11 26.05}
for rel in $RELS; do
  for l in $LAYOUTS; do
    o=$OUT/$rel/$l; mkdir -p $o
    D=$P/$l
    if [ -n "${ROOT[$rel]:-}" ]; then
      R=${ROOT[$rel]}; cp $H/rec/layout.sh $R/layout.sh
      chroot $R /bin/bash /layout.sh $D $l
      cmd=(/usr/sbin/slurmd -G -f $D/etc/slurm.conf -N gfnode)
      run=($H/bin/gfroot -root $R -bind $H/munge -- "${cmd[@]}")
      ver=$(chroot $R /usr/sbin/slurmd -V); cfg=$R$D/etc
    else
      $H/rec/layout.sh $D $l
      if [ $rel = 22.05 ]; then sd=/usr/sbin/slurmd; else sd=${SRC[$rel]}/sbin/slurmd; fi
      cmd=($sd -G -f $D/etc/slurm.conf -N gfnode)
      run=("${cmd[@]}")
      ver=$($sd -V); cfg=$D/etc
    fi
    start=$(date +%s.%N)
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C timeout 60 "${run[@]}" >$o/stdout 2>$o/stderr; rc=$?
    end=$(date +%s.%N)
    echo $rc > $o/rc
    cp $cfg/*.conf $o/ ; rm -f $o/cgroup.conf
    printf '%s\n%s\n' "$ver" "${cmd[*]}" > $o/command
    printf '%-6s %-18s rc=%s %.2fs %s lines\n' $rel $l $rc $(echo "$end - $start" | bc) $(grep -c 'Gres Name=' $o/stderr)
  done
done
