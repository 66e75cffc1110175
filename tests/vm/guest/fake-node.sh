#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Sourced INSIDE the throw-away VM by the scripts run-in-vm.sh runs (it copies
# this file into every run's share as /host/fake-node.sh): the single-node
# Slurm that every guest script starts from.
#
# fake_gpu_node [SLURM_CONF_LINE...]: four fake GPUs (major 195: an allowed
# open gives ENXIO, a denied one EPERM) and nvidiactl, the job user alice
# (uid 2001), slurm.conf with the given extra lines, gres.conf for the four
# GPUs, cgroup.conf with ConstrainDevices=no, and Slurm's log folder. The
# caller writes plugstack.conf and starts the daemons.
fake_gpu_node() {
	local i cpus mem
	for i in 0 1 2 3; do mknod -m 666 /dev/nvidia$i c 195 $i; done
	mknod -m 666 /dev/nvidiactl c 195 255
	useradd -m -u 2001 alice
	cpus=$(nproc); mem=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 - 300 ))
	{
		cat <<EOC
ClusterName=vmtest
SlurmctldHost=vmnode
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
PrologFlags=Contain
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
MpiDefault=none
EOC
		printf '%s\n' "$@"
		echo "NodeName=vmnode CPUs=$cpus RealMemory=$mem Gres=gpu:4 State=UNKNOWN"
		echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
	} > /etc/slurm/slurm.conf
	echo 'Name=gpu File=/dev/nvidia[0-3]' > /etc/slurm/gres.conf
	printf 'CgroupPlugin=cgroup/v2\nConstrainDevices=no\n' > /etc/slurm/cgroup.conf
	mkdir -p /var/log/slurm && chown slurm:slurm /var/log/slurm
}

# shipped_gpufence_node: the fake node with gpufence installed from /host
# as a node image has it (the agent under the shipped units, the plugin in
# plugstack.conf), and gpufence, munge, slurmctld and slurmd started.
shipped_gpufence_node() {
	install -d /usr/lib/gpufence /usr/sbin
	install -m 0755 /host/gpufence /usr/sbin/gpufence
	install -m 0755 /host/spank_gpufence.so /host/gf-open /usr/lib/gpufence/
	fake_gpu_node PlugStackConfig=/etc/slurm/plugstack.conf
	echo 'required /usr/lib/gpufence/spank_gpufence.so' > /etc/slurm/plugstack.conf
	install -m 0644 /host/gpufence.service /host/gpufence.socket /etc/systemd/system/
	systemctl daemon-reload
	systemctl start gpufence.socket gpufence munge slurmctld slurmd; sleep 2
	systemctl is-active gpufence.socket gpufence munge slurmctld slurmd
}
