#!/bin/bash
# Runs INSIDE the throw-away VM (tests/vm/run-in-vm.sh): issue 18's attack 4
# (exe spoofed in a user namespace) on a production-like node, with the
# agent under the SHIPPED unit (packaging/systemd: PrivateTmp, ProtectSystem,
# so the agent's mount namespace is not the node's). Run from the tree:
#
#   make build && CGO_ENABLED=0 go build -o bin/gf-open ./tests/cmd/gf-open
#   tests/vm/run-in-vm.sh tests/vm/exe-systemd.sh bin/gpufence bin/spank_gpufence.so \
#       bin/gf-open packaging/systemd/gpufence.service packaging/systemd/gpufence.socket
#
# It fails when a job's program under /tmp (the node's /tmp, not the
# agent's private one) is not verified, or when /usr/bin/true bound over by
# the job user in their own namespace is.
# SPDX-License-Identifier: Apache-2.0
set -u
fail=0
uname -r; echo "PID1: $(cat /proc/1/comm)"; sysctl kernel.unprivileged_userns_clone user.max_user_namespaces 2>/dev/null
. /host/fake-node.sh
shipped_gpufence_node
pid=$(systemctl show -p MainPID --value gpufence)
echo "agent mount namespace $(readlink /proc/$pid/ns/mnt), node's (PID 1) $(readlink /proc/1/ns/mnt)"
[ "$(readlink /proc/$pid/ns/mnt)" != "$(readlink /proc/1/ns/mnt)" ] || { echo "FAIL: the shipped unit did not give the agent a mount namespace of its own"; fail=1; }
for i in $(seq 60); do [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] && break; sleep 1; done
P="/dev/nvidia0 /dev/nvidia1 /dev/nvidia2 /dev/nvidia3"
su alice -c "install -m 0755 /usr/lib/gpufence/gf-open /tmp/alice-open"
ino=$(stat -c %i /tmp/alice-open)
# records JOB: the job's denied gpu_access records, once three are there.
records() {
	local i
	for i in $(seq 60); do
		[ "$(grep '"event":"gpu_access"' /var/log/gpufence/audit.jsonl | grep '"decision":"denied"' | grep -c "\"job_id\":$1,")" -ge 3 ] && break
		sleep 1
	done
	grep '"event":"gpu_access"' /var/log/gpufence/audit.jsonl | grep '"decision":"denied"' | grep "\"job_id\":$1,"
}
# step NAME COMMAND...: a gpu:1 job whose srun step runs COMMAND, which
# opens every GPU until /tmp/stop-NAME exists; prints the job id.
step() {
	local name=$1; shift
	printf '#!/bin/sh\nexec srun --gres=gpu:1 %s -until /tmp/stop-%s -sleep 20ms %s\n' "$*" "$name" "$P" > /tmp/$name.sh
	chmod 0755 /tmp/$name.sh
	su alice -c "sbatch --parsable --gres=gpu:1 -o /tmp/$name.out /tmp/$name.sh"
}
echo "== a program under the node's /tmp"
job=$(step plain /tmp/alice-open); echo "job $job"
r=$(records "$job"); echo "$r" | head -3
[ "$(grep -c . <<<"$r")" -ge 3 ] || { echo "FAIL: too few denied records for job $job"; cat /tmp/plain.out; fail=1; }
grep -v '"exe":"/tmp/alice-open","exe_status":"verified"' <<<"$r" | grep . && { echo "FAIL: a record of /tmp/alice-open is not verified"; fail=1; }
touch /tmp/stop-plain
echo "== the bind-mount spoof in alice's own user and mount namespace"
job=$(step spoof "unshare -Urm sh -c 'mount --bind \"\$0\" /usr/bin/true && exec /usr/bin/true \"\$@\"' /tmp/alice-open"); echo "job $job"
cat /tmp/spoof.sh
r=$(records "$job"); echo "$r" | head -3
[ "$(grep -c . <<<"$r")" -ge 3 ] || { echo "FAIL: too few denied records for job $job"; cat /tmp/spoof.out; fail=1; }
grep '"exe_status":"verified"' <<<"$r" && { echo "FAIL: the spoofed /usr/bin/true is verified"; fail=1; }
grep -v "\"exe_status\":\"other_namespace\",\"exe_namespace_path\":\"/usr/bin/true\",\"exe_mnt_ns\":[0-9]*,\"exe_dev\":\"[0-9:]*\",\"exe_ino\":$ino," <<<"$r" | grep . && { echo "FAIL: a spoof record is not other_namespace with alice-open's inode $ino"; fail=1; }
touch /tmp/stop-spoof
for i in $(seq 60); do [ -z "$(squeue -h)" ] && break; sleep 1; done
/usr/sbin/gpufence audit tail --denied | tail -4
[ "$fail" = 0 ] && echo "PASS" || echo "FAILED"
exit "$fail"
