#!/bin/bash
# Runs INSIDE the throw-away VM of tests/vm/run-in-vm.sh (systemd PID 1, pure
# cgroup v2, Slurm 22.05 under systemd, kernel 6.1); tests/vm/upgrade.sh
# starts it. A live upgrade and a restart under load:
#   1. install the older package (/host/old.deb, or /host/old.rpm with the
#      rpm tool from /host/rpmtools), enable the agent, restart slurmd once;
#   2. a job holding one fake GPU probes its own and the three other GPUs in
#      a tight loop, logging each open with its time, for the whole test;
#   3. 100 steps (half gpu:1, half --gres=none) start at once in another job
#      while `apt install ./new.deb` (or `rpm -U`) upgrades the package, and
#      100 more while `systemctl restart gpufence` runs;
#   4. upgradecheck judges: the probe's own GPU never gave EPERM, no foreign
#      GPU opened, every step exited 0, and the audit trail accounts for
#      every access (records + suppressed counts = attempts, per step, GPU
#      and decision); a pinger measures how long the socket went unanswered.
# Mode (deb or rpm) is in /host/upgrade-mode.
# SPDX-License-Identifier: Apache-2.0
set -u
MODE=$(cat /host/upgrade-mode)
N=${BURST_N:-100}
# Steps of a burst in flight at once, and the plugin's timeout (and the
# agent's request_timeout): the guest is
# emulated (TCG, no KVM on this kind of host), tens of times slower than a
# node, so an agent start that takes well under a second on a node takes
# 5-20 s here; the timeout is scaled by the same factor (the default is 5).
PAR=${BURST_PAR:-25}
PLUGIN_TIMEOUT=${PLUGIN_TIMEOUT:-60}
fail=0
bad() { echo "FAIL: $*"; fail=1; }
now() { date +%s.%6N; }
idle() {
	for i in $(seq 120); do [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] && return 0; sleep 1; done
	sinfo -R; bad "node not idle"
}
# running JOBID: wait until the job runs.
running() {
	for i in $(seq 120); do [ "$(squeue -h -j "$1" -o %T 2>/dev/null)" = RUNNING ] && return 0; sleep 1; done
	squeue; bad "job $1 does not run"
}
# idx JOBID: the GPU indices Slurm gave the job (scontrol show job -d:
# GRES=gpu:1(IDX:0)), from slurmctld, not from anything the job says.
idx() { scontrol show job -d "$1" | sed -n 's/.*GRES=gpu[^(]*(IDX:\([0-9,-]*\)).*/\1/p' | head -1; }
metrics() {
	exec 3<>/dev/tcp/127.0.0.1/9945 || return 1
	printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
	cat <&3
	exec 3<&-
}
# snap LABEL: the agent's pid, open fds and threads (from /proc: the
# unauthenticated /metrics no longer shows the agent's own process figures).
snap() {
	local pid m
	pid=$(systemctl show -p MainPID --value gpufence)
	m=$(metrics)
	echo "agent $1: pid=$pid fds=$(ls /proc/"$pid"/fd 2>/dev/null | wc -l)" \
		"threads=$(awk '/^Threads:/{print $2}' /proc/"$pid"/status 2>/dev/null)" \
		"shed=$(awk '/^gpufence_requests_shed_total /{print $2}' <<<"$m")" \
		"lost=$(awk '/^gpufence_audit_records_lost_total/{s+=$2} END{print s+0}' <<<"$m")" \
		"version=$(sed -n 's/^gpufence_build_info{.*version="\([^"]*\)".*/\1/p' <<<"$m")"
}
# burst DIR: start N steps at once in the burst job, in the background.
burst() {
	install -d -o alice "$1"
	su alice -c "bash /srv/up/burst.sh $BJ $1 $N $PAR" &
	BURST_PID=$!
}
# wait_started DIR K: until K steps of the burst have ended (the rest are
# starting or registering).
wait_started() {
	for i in $(seq 600); do [ "$(ls "$1"/*.rc 2>/dev/null | wc -l)" -ge "$2" ] && return 0; sleep 0.2; done
}

uname -r; echo "PID1: $(cat /proc/1/comm)"; echo "mode: $MODE"
. /host/fake-node.sh
# Emulated guest: srun's launch RPC to a busy slurmd takes longer than 10 s.
fake_gpu_node MessageTimeout=60
install -m 0755 /host/gf-open /host/upgradecheck /usr/local/bin/
install -d -o alice /srv/up
grep -q '^include /etc/slurm/plugstack.conf.d/\*.conf' /etc/slurm/plugstack.conf 2>/dev/null ||
	echo 'include /etc/slurm/plugstack.conf.d/*.conf' > /etc/slurm/plugstack.conf
systemctl start munge slurmctld slurmd

# Every step of a burst: its output (gf-open -env) and "RC START END".
cat > /srv/up/burst.sh <<'EOS'
job=$1 dir=$2 n=$3 par=$4
for i in $(seq 1 "$n"); do
	while [ "$(jobs -rp | wc -l)" -ge "$par" ]; do wait -n; done
	if [ $((i % 2)) = 0 ]; then kind=gpu opt=--gres=gpu:1; else kind=cpu opt=--gres=none; fi
	(
		s=$(date +%s.%6N)
		timeout 300 srun --jobid="$job" --overlap $opt -J "$kind-$i" gf-open -env /dev/nvidia0 /dev/nvidia1 /dev/nvidia2 /dev/nvidia3 > "$dir/$kind-$i.out" 2>&1
		rc=$?
		echo "$rc $s $(date +%s.%6N)" > "$dir/$kind-$i.rc"
	) &
done
wait
EOS

echo "== install the older package"
case $MODE in
deb)
	dpkg -i /host/old.deb || bad "dpkg -i old.deb failed"
	OLD=$(dpkg-query -W -f '${Version}' gpufence)
	;;
rpm)
	# Debian's rpm, to run the rpm's own scriptlets under systemd; --nodeps:
	# the rpm database knows nothing of the dpkg-installed libc.
	dpkg -i --force-depends /host/rpmtools/*.deb >/dev/null || bad "installing the rpm tool failed"
	rpm --version
	rpm -i --nodeps --force-debian /host/old.rpm || bad "rpm -i old.rpm failed"
	OLD=$(rpm -q --qf '%{VERSION}-%{RELEASE}' gpufence)
	echo "after %post (preset): socket $(systemctl is-enabled gpufence.socket), service $(systemctl is-enabled gpufence.service)"
	# What %post tells the admin to do.
	systemctl enable --now gpufence.socket gpufence.service || bad "systemctl enable --now failed"
	;;
esac
echo "installed $OLD"
# The admin's edit of the packaged conffile, kept across the upgrade.
sed -i "s|^required /usr/lib/gpufence/spank_gpufence.so\$|& timeout=$PLUGIN_TIMEOUT|" /etc/slurm/plugstack.conf.d/gpufence.conf
grep '^required' /etc/slurm/plugstack.conf.d/gpufence.conf
# The agent's own limit on reading a request, scaled alike: a pinger or a
# client starved for 5 s in the emulated guest is not an agent fault.
sed -i "s|^#request_timeout: 5s\$|request_timeout: ${PLUGIN_TIMEOUT}s|" /etc/gpufence/agent.yaml
grep '^request_timeout' /etc/gpufence/agent.yaml || bad "request_timeout not set"
systemctl restart gpufence || bad "the agent does not restart with request_timeout"
systemctl is-active gpufence.socket gpufence.service || bad "the agent does not run"
ls -l /usr/lib/gpufence/spank_gpufence.so
systemctl restart slurmd
idle

echo "== the probe job and the burst job"
PJ=$(su alice -c "sbatch --parsable --gres=gpu:1 -o /srv/up/probe.out -J probe --wrap 'gf-open -stamp -until /srv/up/probe.stop -sleep 10ms /dev/nvidia0 /dev/nvidia1 /dev/nvidia2 /dev/nvidia3'")
running "$PJ"
BJ=$(su alice -c "sbatch --parsable --gres=gpu:2 -o /dev/null -J burst --wrap 'sleep 3000'")
running "$BJ"
PG=$(idx "$PJ"); BG=$(idx "$BJ")
echo "probe job $PJ holds GPU $PG; burst job $BJ holds GPUs $BG"
upgradecheck ping -until /srv/up/ping.stop > /srv/up/pings 2>&1 &
PING=$!
sleep 5
echo "probe: $(wc -l < /srv/up/probe.out) opens so far"
snap before

echo "== upgrade under a burst of $N steps"
burst /srv/up/burst-upgrade
wait_started /srv/up/burst-upgrade 5
U0=$(now)
case $MODE in
deb) apt-get install -y --no-install-recommends /host/new.deb 2>&1 | grep -v '^\(Reading\|Building\)' || bad "apt install ./new.deb failed"
	NEW=$(dpkg-query -W -f '${Version}' gpufence) ;;
rpm) rpm -U --nodeps --force-debian /host/new.rpm || bad "rpm -U new.rpm failed"
	NEW=$(rpm -q --qf '%{VERSION}-%{RELEASE}' gpufence) ;;
esac
U1=$(now)
echo "upgraded $OLD -> $NEW in $(awk "BEGIN{print $U1 - $U0}") s"
[ "$OLD" != "$NEW" ] || bad "the version did not change"
grep -q "^required .*timeout=$PLUGIN_TIMEOUT" /etc/slurm/plugstack.conf.d/gpufence.conf || bad "the upgrade replaced the admin's plugstack line"
grep -q "^request_timeout: ${PLUGIN_TIMEOUT}s" /etc/gpufence/agent.yaml || bad "the upgrade replaced the admin's agent.yaml"
wait "$BURST_PID"
systemctl show gpufence -p ActiveState -p NRestarts -p MainPID
snap after-upgrade

echo "== systemctl restart gpufence under a burst of $N steps"
burst /srv/up/burst-restart
wait_started /srv/up/burst-restart 5
R0=$(now)
systemctl restart gpufence || bad "systemctl restart failed"
R1=$(now)
echo "systemctl restart took $(awk "BEGIN{print $R1 - $R0}") s"
wait "$BURST_PID"
systemctl show gpufence -p ActiveState -p NRestarts
snap after-restart

echo "== end the jobs; let the agent report the last counts"
touch /srv/up/probe.stop
for i in $(seq 120); do [ -z "$(squeue -h -j "$PJ" 2>/dev/null)" ] && break; sleep 1; done
scancel "$BJ"
for i in $(seq 120); do [ -z "$(squeue -h)" ] && break; sleep 1; done
# The probe's step is released (step end or epilog), then its last counts
# go out at the next flush (audit.flush_interval, 5 s).
for i in $(seq 60); do
	grep -q "\"event\":\"policy_released\".*\"job_id\":$PJ,\"step_id\":\"batch\"" /var/log/gpufence/audit.jsonl && break
	sleep 1
done
sleep 12
touch /srv/up/ping.stop; wait "$PING"
snap end

echo "== journal: agent stops and starts"
journalctl -u gpufence -o short-unix --no-pager | grep -v "GPU access\|GPU [0-9] (/dev" |
	grep -E "Stopping|Started|Stopped|stopped|agent ready|adopted_pinned|restored jobs|level=(ERROR|WARN)" | head -40
echo "== maintainer scripts"
journalctl -o short-unix --no-pager | grep -iE "gpufence.*(link|warn|error)" | grep -v "level=INFO" | head -10

echo "== judge"
# The restart windows: from the command's start to the new agent's ready.
upgradecheck check -audit /var/log/gpufence/audit.jsonl -probe /srv/up/probe.out -probe-job "$PJ" -probe-gpus "$PG" \
	-burst-job "$BJ" -burst-gpus "$BG" -burst-n "$N" -burst /srv/up/burst-upgrade -burst /srv/up/burst-restart \
	-pings /srv/up/pings -window "upgrade:$U0:$U1" -window "restart:$R0:$R1" || bad "upgradecheck"

if [ "$fail" != 0 ]; then
	echo "== failed steps (first 3)"
	grep -L '^0 ' /srv/up/burst-*/*.rc 2>/dev/null | head -3 | while read -r f; do echo "-- $f: $(cat "$f")"; tail -5 "${f%.rc}.out"; done
fi
# Everything to look at afterwards: upgrade.sh copies it out of the VM.
if [ -d /host/artifacts ]; then
	cp -a /srv/up/. /host/artifacts/
	cp /var/log/gpufence/audit.jsonl /var/log/slurm/slurmd.log /var/log/slurm/slurmctld.log /host/artifacts/
	journalctl -u gpufence -o short-unix --no-pager > /host/artifacts/agent.journal
	journalctl -o short-unix --no-pager > /host/artifacts/all.journal
fi
echo "result: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
