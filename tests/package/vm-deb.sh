#!/bin/bash
# Runs INSIDE the throw-away VM of tests/vm/run-in-vm.sh (systemd as PID 1,
# pure cgroup v2, Slurm 22.05 under systemd, kernel 6.1): installs the .deb
# with dpkg as an admin would, and checks what the unit tests cannot do
# without systemd: postinst enables and starts the socket and the hardened
# Type=notify service, the agent attaches and enforces under that hardening,
# Slurm loads the plugin through the shipped plugstack snippet after one
# slurmd restart, reload and logrotate reopen the audit file, and removal
# stops the agent and detaches its pinned filter.
#   tests/vm/run-in-vm.sh tests/package/vm-deb.sh dist/gpufence_*.deb bin/gf-open
# SPDX-License-Identifier: Apache-2.0
set -u
fail=0
bad() { echo "FAIL: $*"; fail=1; }
# Never wait forever for a node or an allocation.
job() { timeout 120 su alice -c "$*"; }
idle() {
	for i in $(seq 90); do [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] && return 0; sleep 1; done
	sinfo -R; bad "node not idle"
}
check() { # check OUTPUT DEVICE WANT
	grep -q "^$2 $3\$" <<<"$1" || bad "$2 is not $3"
}
uname -r; echo "PID1: $(cat /proc/1/comm)"
. /host/fake-node.sh
fake_gpu_node
install -m 0755 /host/gf-open /usr/local/bin/gf-open
# Debian's own plugstack.conf, which includes plugstack.conf.d/*.conf.
echo "plugstack.conf: $(cat /etc/slurm/plugstack.conf)"
grep -q '^include /etc/slurm/plugstack.conf.d/\*.conf' /etc/slurm/plugstack.conf ||
	echo 'include /etc/slurm/plugstack.conf.d/*.conf' > /etc/slurm/plugstack.conf
systemctl start munge slurmctld slurmd

echo "== dpkg -i"
dpkg -i /host/gpufence_*.deb || bad "dpkg -i failed"
systemctl is-enabled gpufence.socket gpufence.service
systemctl is-active gpufence.socket gpufence.service || bad "postinst did not start the agent"
systemctl show gpufence -p Type -p ActiveState -p WatchdogUSec -p NRestarts -p ProtectSystem -p NoNewPrivileges
ls -l /usr/lib/gpufence/spank_gpufence.so
journalctl -u gpufence --no-pager -o cat | grep -E "socket_activated=true" >/dev/null || bad "the agent did not take the activated socket"
journalctl -u gpufence --no-pager -o cat | grep -iE "level=(error|warn)|fail|read-only" | head -5
ls -ld /var/lib/gpufence /var/log/gpufence /var/spool/gpufence /run/gpufence /run/gpufence/agent.sock
ls /sys/fs/bpf/gpufence || bad "nothing pinned"

echo "== restart slurmd once, then jobs"
systemctl restart slurmd
idle
sinfo
P="/dev/nvidia0 /dev/nvidia1 /dev/nvidia2 /dev/nvidia3 /dev/nvidiactl"
o=$(job "srun -I60 --gres=gpu:1 gf-open -env $P"); echo "$o"
check "$o" /dev/nvidia0 ENXIO; check "$o" /dev/nvidia1 EPERM; check "$o" /dev/nvidia3 EPERM; check "$o" /dev/nvidiactl ENXIO
o=$(job "CUDA_VISIBLE_DEVICES=0,1,2,3 SLURM_STEP_GPUS=0,1,2,3 srun -I60 --gres=gpu:2 gf-open $P"); echo "$o"
check "$o" /dev/nvidia1 ENXIO; check "$o" /dev/nvidia2 EPERM
[ "$(grep -c '"decision":"denied"' /var/log/gpufence/audit.jsonl)" -ge 3 ] || bad "too few denied audit records"
stat -c '%a %n' /var/log/gpufence/audit.jsonl /var/lib/gpufence/state.json
gpufence status | head -20
gpufence doctor; echo "doctor rc=$?"

echo "== reload and logrotate reopen the audit file"
systemctl reload gpufence || bad "systemctl reload failed"
if command -v logrotate >/dev/null; then
	logrotate -f /etc/logrotate.d/gpufence || bad "logrotate failed"
else
	# The image has no logrotate: rotate as it would, with the unit's postrotate.
	mv /var/log/gpufence/audit.jsonl /var/log/gpufence/audit.jsonl.1
	sh -c "$(sed -n '/postrotate/,/endscript/p' /etc/logrotate.d/gpufence | sed '1d;$d')" || bad "postrotate failed"
fi
sleep 1
job "srun -I60 --gres=gpu:1 gf-open /dev/nvidia2" >/dev/null
sleep 1
ls -l /var/log/gpufence/
[ -s /var/log/gpufence/audit.jsonl ] || bad "no records in the new audit file after rotation"
systemctl show gpufence -p ActiveState -p NRestarts
[ "$(systemctl show gpufence -p NRestarts --value)" = 0 ] || bad "the agent restarted"

echo "== dpkg -r: stops the agent and detaches the filter"
dpkg -r gpufence 2>&1
systemctl is-active gpufence.service gpufence.socket
[ -e /sys/fs/bpf/gpufence ] && bad "pinned filter left after dpkg -r"
rm -f /etc/slurm/plugstack.conf.d/gpufence.conf
systemctl restart slurmd
idle
o=$(job "srun -I60 gf-open /dev/nvidia1"); echo "$o"
check "$o" /dev/nvidia1 ENXIO
dpkg -P gpufence 2>&1
ls -d /var/lib/gpufence /var/log/gpufence /etc/gpufence /usr/lib/gpufence 2>/dev/null && bad "left after purge"
echo "result: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
