#!/bin/bash
# Runs INSIDE the throw-away VM (tests/vm/run-in-vm.sh): a production-like
# node with systemd as PID 1, pure cgroup v2, Slurm 22.05 under systemd and
# kernel 6.1. Installs the built gpufence files from /host, runs the agent as
# a systemd service with its defaults, and shows isolation with
# ConstrainDevices=no and =yes, the audit file and journald. It fails when a
# foreign GPU opens or an own one does not.
# SPDX-License-Identifier: Apache-2.0
set -u
fail=0
check() { # check OUTPUT DEVICE WANT
	if ! grep -q "^$2 $3\$" <<<"$1"; then echo "FAIL: $2 is not $3"; fail=1; fi
}
uname -r; echo "PID1: $(cat /proc/1/comm)"
install -d /usr/lib/gpufence
install -m 0755 /host/gpufence /host/spank_gpufence.so /host/gf-open /usr/lib/gpufence/
. /host/fake-node.sh
fake_gpu_node PlugStackConfig=/etc/slurm/plugstack.conf
echo 'required /usr/lib/gpufence/spank_gpufence.so' > /etc/slurm/plugstack.conf
cat > /etc/systemd/system/gpufence.socket <<EOC
[Unit]
Description=gpufence agent socket
[Socket]
ListenStream=/run/gpufence/agent.sock
SocketMode=0600
DirectoryMode=0755
[Install]
WantedBy=sockets.target
EOC
cat > /etc/systemd/system/gpufence.service <<EOC
[Unit]
Description=gpufence agent
Requires=gpufence.socket
After=gpufence.socket
Before=slurmd.service
[Service]
Type=notify
WatchdogSec=10
ExecStart=/usr/lib/gpufence/gpufence agent --log-level debug
Restart=on-failure
[Install]
WantedBy=multi-user.target
EOC
systemctl daemon-reload
systemctl start gpufence.socket gpufence munge slurmctld slurmd; sleep 2
systemctl is-active gpufence.socket gpufence munge slurmctld slurmd
# Type=notify: active only after READY=1 (filter attached or waiting for the scope).
systemctl show gpufence -p Type -p ActiveState -p WatchdogUSec -p NRestarts
journalctl -u gpufence --no-pager -o cat | grep -E "socket_activated=true" >/dev/null || { echo "FAIL: the agent did not take the activated socket"; fail=1; }
for i in $(seq 60); do [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] && break; sleep 1; done
sinfo
P="/dev/nvidia0 /dev/nvidia1 /dev/nvidia2 /dev/nvidia3 /dev/nvidiactl"
echo "== srun gpu:1 (ConstrainDevices=no)"; o=$(su alice -c "srun --gres=gpu:1 /usr/lib/gpufence/gf-open -env $P"); echo "$o"
check "$o" /dev/nvidia0 ENXIO; check "$o" /dev/nvidia1 EPERM; check "$o" /dev/nvidia3 EPERM; check "$o" /dev/nvidiactl ENXIO
echo "== srun gpu:2 forged"; o=$(su alice -c "CUDA_VISIBLE_DEVICES=0,1,2,3 SLURM_STEP_GPUS=0,1,2,3 srun --gres=gpu:2 /usr/lib/gpufence/gf-open -env $P"); echo "$o"
check "$o" /dev/nvidia1 ENXIO; check "$o" /dev/nvidia2 EPERM; check "$o" /dev/nvidia3 EPERM
echo "== cpu-only"; o=$(su alice -c "srun /usr/lib/gpufence/gf-open $P"); echo "$o"
check "$o" /dev/nvidia0 EPERM; check "$o" /dev/nvidia3 EPERM
printf 'CgroupPlugin=cgroup/v2\nConstrainDevices=yes\n' > /etc/slurm/cgroup.conf; systemctl restart slurmd
for i in $(seq 60); do [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] && break; sleep 1; done
echo "== srun gpu:1 (ConstrainDevices=yes)"; o=$(su alice -c "srun --gres=gpu:1 /usr/lib/gpufence/gf-open -env $P"); echo "$o"
check "$o" /dev/nvidia0 ENXIO; check "$o" /dev/nvidia1 EPERM; check "$o" /dev/nvidiactl ENXIO
echo "== systemctl restart gpufence while a job runs; the job keeps its isolation"
su alice -c "sbatch -o /tmp/probe.out --gres=gpu:1 --wrap '/usr/lib/gpufence/gf-open -loop 400 -sleep 10ms $P'" ; sleep 2
systemctl restart gpufence; sleep 1
systemctl show gpufence -p ActiveState -p NRestarts
for i in $(seq 60); do [ -z "$(squeue -h)" ] && break; sleep 1; done
sort /tmp/probe.out | uniq -c
[ "$(grep -c '^/dev/nvidia1 ENXIO\|^/dev/nvidia1 OK' /tmp/probe.out)" = 0 ] || { echo "FAIL: a foreign GPU opened across the restart"; fail=1; }
echo "== bpftool cgroup tree (scope)"; bpftool cgroup tree /sys/fs/cgroup/system.slice 2>/dev/null | grep -E 'slurmstepd|devfilter|Slurm' | head
echo "== agent journal"; journalctl -u gpufence --no-pager -o cat | grep -E 'attached|exempt|denied|applied' | head -20
echo "== audit file"; wc -l /var/log/gpufence/audit.jsonl; /usr/lib/gpufence/gpufence audit tail --denied | head -8
echo "== journald records"; journalctl -o json --no-pager SYSLOG_IDENTIFIER=gpufence 2>/dev/null | head -c 600; echo
echo "== Slurm's scope stopped with no job running, slurmd started again: re-attached, isolated"
for i in $(seq 60); do [ -z "$(squeue -h)" ] && break; sleep 1; done
SCOPE=/sys/fs/cgroup/system.slice/vmnode_slurmstepd.scope
old=$(stat -c %i $SCOPE)
systemctl stop slurmd vmnode_slurmstepd.scope; systemctl start slurmd
for i in $(seq 60); do [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] && break; sleep 1; done
new=$(stat -c %i $SCOPE 2>/dev/null)
echo "scope cgroup $old -> $new"
[ -n "$new" ] && [ "$old" != "$new" ] || { echo "FAIL: the scope was not made again"; fail=1; }
o=$(su alice -c "srun --gres=gpu:1 /usr/lib/gpufence/gf-open -env $P"); echo "$o"
check "$o" /dev/nvidia0 ENXIO; check "$o" /dev/nvidia1 EPERM; check "$o" /dev/nvidia2 EPERM; check "$o" /dev/nvidia3 EPERM
grep '"event":"filter_reattached"' /var/log/gpufence/audit.jsonl | tail -1
grep -q '"event":"filter_reattached"' /var/log/gpufence/audit.jsonl || { echo "FAIL: no filter_reattached audit record"; fail=1; }
systemctl stop slurmd gpufence
[ "$(grep -c '"decision":"denied"' /var/log/gpufence/audit.jsonl)" -ge 7 ] || { echo "FAIL: too few denied audit records"; fail=1; }
echo "result: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
