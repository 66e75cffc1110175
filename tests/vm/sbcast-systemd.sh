#!/bin/bash
# Runs INSIDE the throw-away VM (tests/vm/run-in-vm.sh): issue 18's attack 6
# (sbcast onto another job's GPU) where production has it, slurmd under
# systemd in slurmd.service, outside Slurm's scope, with the agent under the
# shipped unit. Run from the tree:
#
#   make build && CGO_ENABLED=0 go build -o bin/gf-open ./tests/cmd/gf-open
#   tests/vm/run-in-vm.sh tests/vm/sbcast-systemd.sh bin/gpufence bin/spank_gpufence.so \
#       bin/gf-open packaging/systemd/gpufence.service packaging/systemd/gpufence.socket
#
# It fails when the job user's `sbcast -f /bin/true /dev/nvidiaN` (a GPU the
# victim's job holds) is not refused with EPERM, when the audit file has no
# denial naming slurmd's cgroup, when root in slurmd.service loses a GPU
# (slurmd's NVML), and the same again after `systemctl restart slurmd`
# made slurmd.service anew.
# SPDX-License-Identifier: Apache-2.0
set -u
fail=0
uname -r; echo "PID1: $(cat /proc/1/comm)"
. /host/fake-node.sh
shipped_gpufence_node
for i in $(seq 60); do [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] && break; sleep 1; done
AUDIT=/var/log/gpufence/audit.jsonl
# slurmd_cgroup: slurmd's cgroup directory, as the kernel says.
slurmd_cgroup() { echo "/sys/fs/cgroup$(sed -n 's/^0:://p' "/proc/$(systemctl show -p MainPID --value slurmd)/cgroup")"; }
# probe WHO: gf-open of /dev/nvidia0 in slurmd's cgroup as root, or as alice
# the way slurmd's sbcast child is (real and effective uid alice).
probe() {
	local cg; cg=$(slurmd_cgroup)
	if [ "$1" = root ]; then
		sh -c "echo \$\$ > $cg/cgroup.procs && exec /usr/lib/gpufence/gf-open /dev/nvidia0"
	else
		sh -c "echo \$\$ > $cg/cgroup.procs && exec setpriv --reuid=2001 --regid=2001 --clear-groups /usr/lib/gpufence/gf-open /dev/nvidia0"
	fi
}
victim=$(sbatch --parsable --gres=gpu:3 -o /dev/null --wrap 'sleep 600')
for i in $(seq 60); do [ "$(squeue -h -j "$victim" -o %T)" = RUNNING ] && break; sleep 1; done
vidx=$(scontrol -d show job "$victim" | grep -o 'gpu[^ ]*(IDX:[^)]*)' | head -1)
echo "victim job $victim (root) holds $vidx"
target=$(sed -n 's/.*IDX:\([0-9]*\).*/\1/p' <<<"$vidx"); target=/dev/nvidia${target:-0}
# attack ROUND: alice's gpu:1 job broadcasts /bin/true onto the victim's GPU.
attack() {
	local round=$1 job cg before
	cg=$(slurmd_cgroup)
	echo "== round $round: slurmd in $cg (cgroup $(stat -c %i "$cg")); alice: sbcast -f /bin/true $target"
	before=$(grep -c . "$AUDIT")
	printf '#!/bin/sh\nsbcast -f /bin/true %s\necho "sbcast rc=$?"\n' "$target" > /tmp/sbcast.sh; chmod 0755 /tmp/sbcast.sh
	job=$(su alice -c "sbatch --parsable --gres=gpu:1 -o /tmp/sbcast-$round.out /tmp/sbcast.sh")
	for i in $(seq 90); do [ -z "$(squeue -h -j "$job")" ] && break; sleep 1; done
	cat /tmp/sbcast-$round.out
	grep -q 'Operation not permitted' /tmp/sbcast-$round.out || { echo "FAIL: round $round: sbcast onto $target was not refused with EPERM"; fail=1; }
	grep -q 'sbcast rc=0' /tmp/sbcast-$round.out && { echo "FAIL: round $round: sbcast succeeded"; fail=1; }
	local rec=""
	for i in $(seq 30); do
		rec=$(tail -n +"$((before + 1))" "$AUDIT" | grep '"event":"gpu_access"' | grep '"decision":"denied"' | grep "non-root process in Slurm's own" | grep -F "${cg#/sys/fs/cgroup/}")
		[ -n "$rec" ] && break; sleep 1
	done
	echo "$rec" | head -2
	[ -n "$rec" ] || { echo "FAIL: round $round: no denial in the audit naming ${cg#/sys/fs/cgroup/}"; tail -n +"$((before + 1))" "$AUDIT" | grep gpu_access | tail -3; fail=1; }
	echo "root in slurmd's cgroup: $(probe root)"; echo "alice in slurmd's cgroup: $(probe alice)"
	probe root | grep -q ENXIO || { echo "FAIL: round $round: root in slurmd's cgroup lost /dev/nvidia0 (slurmd's NVML)"; fail=1; }
	probe alice | grep -q EPERM || { echo "FAIL: round $round: a user's process in slurmd's cgroup opened /dev/nvidia0"; fail=1; }
}
attack 1
old=$(stat -c %i "$(slurmd_cgroup)")
systemctl restart slurmd
for i in $(seq 60); do [ "$(sinfo -h -o %t 2>/dev/null)" = mix ] || [ "$(sinfo -h -o %t 2>/dev/null)" = alloc ] && break; sleep 1; done
new=$(stat -c %i "$(slurmd_cgroup)")
echo "systemctl restart slurmd: slurmd.service was cgroup $old, now $new"
[ "$old" != "$new" ] || echo "NOTE: systemd kept slurmd.service's cgroup (processes left in it)"
attack 2
if [ "$old" != "$new" ]; then
	r=$(grep '"event":"filter_reattached"' "$AUDIT" | grep -F "\"cgroup_id\":$new")
	echo "$r"
	[ -n "$r" ] || { echo "FAIL: no filter_reattached record for slurmd's new cgroup $new"; fail=1; }
fi
st=$(/usr/sbin/gpufence status 2>&1)
grep -E 'slurmd (cgroup|link)' <<<"$st"
grep -q "slurmd link.*cgroup $(stat -c %i "$(slurmd_cgroup)")\$" <<<"$st" || { echo "FAIL: gpufence status shows no link on slurmd's cgroup"; echo "$st" | tail -30; fail=1; }
scancel "$victim"
[ "$fail" = 0 ] && echo "PASS" || echo "FAILED"
exit "$fail"
