#!/bin/bash
# Runs INSIDE the throw-away VM (tests/vm/run-in-vm.sh): the boot order of
# the shipped units on an AutoDetect node (issue 20, item 5). gpufence.service
# is ordered Before=slurmd.service, so the agent asks slurmd -G before slurmd
# ever ran; when that fails it must ask again later, take slurmd's table once
# slurmd -G works and say so. gres.conf is AutoDetect=nvml alone,
# and a fake_gpus.conf beside slurm.conf makes slurmd number the fake GPUs
# 2,3,0,1 (Slurm's GPU 0 is /dev/nvidia2): a table from any other source
# gives a job other devices, or none.
#
# Measured here (Debian 12, Slurm 22.05): with ProtectControlGroups=yes
# (the unit before this test) slurmd -G fails at the agent's start and
# after slurmd runs: it makes <scope>/slurmd (EROFS). The shipped unit
# leaves cgroupfs writable, and slurmd -G works at the start; the script
# accepts the table from slurmd at start or from a late ask, and says which.
# Run from the tree:
#
#   make vm-slurmd-boot-test
#
# It fails when slurmd started before the agent was ready, when the agent's
# log does not say the table came from slurmd (at start or late), or when a
# job does not open exactly its GPUs.
# SPDX-License-Identifier: Apache-2.0
set -u
fail=0
check() { # check OUTPUT DEVICE WANT
	if ! grep -q "^$2 $3\$" <<<"$1"; then echo "FAIL: $2 is not $3"; fail=1; fi
}
uname -r; echo "PID1: $(cat /proc/1/comm)"
install -d /usr/lib/gpufence /usr/sbin
install -m 0755 /host/gpufence /usr/sbin/gpufence
install -m 0755 /host/spank_gpufence.so /host/gf-open /usr/lib/gpufence/
. /host/fake-node.sh
fake_gpu_node PlugStackConfig=/etc/slurm/plugstack.conf
echo 'required /usr/lib/gpufence/spank_gpufence.so' > /etc/slurm/plugstack.conf
# AutoDetect: no File= line; slurmd orders fake_gpus.conf's GPUs by where
# each one's own link (-1) is: order 2,3,0,1 (tests/cluster/autodetect.go).
echo 'AutoDetect=nvml' > /etc/slurm/gres.conf
order=(2 3 0 1); cpus=$(nproc)
for m in 0 1 2 3; do
	l=(0 0 0 0); for i in 0 1 2 3; do [ "${order[$i]}" = $m ] && l[$i]=-1; done
	echo "tesla_t4|$cpus|0-$((cpus-1))|$(IFS=,; echo "${l[*]}")|/dev/nvidia$m"
done > /etc/slurm/fake_gpus.conf
install -m 0644 /host/gpufence.service /host/gpufence.socket /etc/systemd/system/
systemctl daemon-reload
systemctl show gpufence -p Before | tr ' ' '\n' | grep -qx 'slurmd.service' || { echo "FAIL: gpufence.service is not ordered before slurmd.service"; fail=1; }
# One transaction, as at boot: systemd starts slurmd only once the agent is
# ready (Type=notify, Before=slurmd.service).
systemctl start gpufence.socket gpufence.service munge.service slurmctld.service slurmd.service
systemctl is-active gpufence munge slurmctld slurmd
t_agent=$(systemctl show gpufence -p ActiveEnterTimestampMonotonic --value)
t_slurmd=$(systemctl show slurmd -p ExecMainStartTimestampMonotonic --value)
echo "agent ready at ${t_agent} us, slurmd started at ${t_slurmd} us (monotonic)"
[ "$t_agent" -gt 0 ] && [ "$t_agent" -le "$t_slurmd" ] || { echo "FAIL: slurmd started before the agent was ready"; fail=1; }
for i in $(seq 90); do [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] && break; sleep 1; done
sinfo
log() { journalctl -u gpufence --no-pager -o cat; }
echo "== the agent's GPU table at its start"
log | grep -E 'GPU table' | head -3 | cut -c1-400
SCOPE=/sys/fs/cgroup/system.slice/vmnode_slurmstepd.scope
if log | grep -m1 'GPU table' | grep -q 'slurmd -G failed'; then
	echo "== slurmd -G failed at the agent's start; slurmd runs: the agent asks again"
	# The agent's pauses after a failure double from 5 s: at most 80 s here.
	for i in $(seq 100); do log | grep -q "GPU table settled by slurmd's late answer" && break; sleep 1; done
	log | grep -E "slurmd -G failed again|GPU table settled" | cut -c1-400
	echo "scope's slurmd cgroup: $(ls -d $SCOPE/slurmd 2>&1)"
	log | grep "GPU table settled by slurmd's late answer" | grep -q 'source="slurmd -G"' || { echo "FAIL: the agent's log does not say the table came from slurmd"; fail=1; }
	grep '"event":"gpu_table_mismatch"' /var/log/gpufence/audit.jsonl | grep -q 'slurmd_late_switched' || { echo "FAIL: no audit record of the table slurmd's late answer gave"; fail=1; }
else
	echo "== slurmd -G worked at the agent's start, before slurmd ran"
	log | grep -m1 'GPU table' | grep -q 'source="slurmd -G"' || { echo "FAIL: the agent's log does not say the table came from slurmd"; fail=1; }
fi
/usr/sbin/gpufence status 2>&1 | grep -iE 'table|source|gpu [0-9]' | head -8
P="/dev/nvidia0 /dev/nvidia1 /dev/nvidia2 /dev/nvidia3 /dev/nvidiactl"
echo "== srun gpu:1: Slurm's GPU 0 is /dev/nvidia2"; o=$(su alice -c "srun --gres=gpu:1 /usr/lib/gpufence/gf-open -env $P"); echo "$o"
check "$o" /dev/nvidia2 ENXIO; check "$o" /dev/nvidia0 EPERM; check "$o" /dev/nvidia1 EPERM; check "$o" /dev/nvidia3 EPERM; check "$o" /dev/nvidiactl ENXIO
echo "== srun gpu:2: GPUs 0,1 are /dev/nvidia2, /dev/nvidia3"; o=$(su alice -c "srun --gres=gpu:2 /usr/lib/gpufence/gf-open -env $P"); echo "$o"
check "$o" /dev/nvidia2 ENXIO; check "$o" /dev/nvidia3 ENXIO; check "$o" /dev/nvidia0 EPERM; check "$o" /dev/nvidia1 EPERM
echo "== cpu-only"; o=$(su alice -c "srun /usr/lib/gpufence/gf-open $P"); echo "$o"
check "$o" /dev/nvidia0 EPERM; check "$o" /dev/nvidia2 EPERM
echo "== audit"
grep '"event":"gpu_table_mismatch"' /var/log/gpufence/audit.jsonl | cut -c1-300
systemctl stop slurmd gpufence
echo "result: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
