#!/bin/bash
# layout.sh DIR LAYOUT: writes a Slurm config for one slurmd -G recording into DIR.
set -euo pipefail
D=$1; L=$2
rm -rf "$D"; mkdir -p "$D"/{etc,dev/nvidia-caps,state,run,logs}
for i in 0 1 2 3; do mknod "$D/dev/nvidia$i" c 195 $i; done
for m in 138 139 147 148 156 157; do mknod "$D/dev/nvidia-caps/nvidia-cap$m" c 236 $m; done
gres=gpu:4
types=gpu
case $L in
plain)
	echo "Name=gpu File=$D/dev/nvidia[0-3]" > "$D/etc/gres.conf" ;;
multitype)
	gres=gpu:t4:2,gpu:a100:2
	printf 'Name=gpu Type=t4 File=%s/dev/nvidia[2-3]\nName=gpu Type=a100 File=%s/dev/nvidia[0-1]\n' "$D" "$D" > "$D/etc/gres.conf" ;;
mig)
	gres=gpu:a100:1,gpu:1g.10gb:3
	{
		echo "Name=gpu Type=a100 File=$D/dev/nvidia0"
		for c in "138,139" "147,148" "156,157"; do
			echo "Name=gpu Type=1g.10gb MultipleFiles=$D/dev/nvidia1,$D/dev/nvidia-caps/nvidia-cap${c%,*},$D/dev/nvidia-caps/nvidia-cap${c#*,}"
		done
	} > "$D/etc/gres.conf" ;;
autodetect)
	echo "AutoDetect=nvml" > "$D/etc/gres.conf"
	for i in 0 1 2 3; do
		links=$(for j in 0 1 2 3; do [ $j = $i ] && printf -- '-1' || printf 0; [ $j -lt 3 ] && printf , || true; done)
		echo "tesla_t4|2|0-1|$links|$D/dev/nvidia$i"
	done > "$D/etc/fake_gpus.conf" ;;
autodetect-links)
	# NVML's enumeration (PCI bus order) differs from the device minors.
	echo "AutoDetect=nvml" > "$D/etc/gres.conf"
	printf 'tesla_t4|2|0-1|0,0,-1,0|%s/dev/nvidia0\ntesla_t4|2|0-1|0,0,0,-1|%s/dev/nvidia1\ntesla_t4|2|0-1|-1,0,0,0|%s/dev/nvidia2\ntesla_t4|2|0-1|0,-1,0,0|%s/dev/nvidia3\n' "$D" "$D" "$D" "$D" > "$D/etc/fake_gpus.conf" ;;
autodetect-mig)
	gres=gpu:a100:1,gpu:a100_1g.10gb:3
	echo "AutoDetect=nvml" > "$D/etc/gres.conf"
	{
		echo "a100|2|0-1|-1,0|$D/dev/nvidia0"
		for c in "138,139" "147,148" "156,157"; do
			echo "a100_1g.10gb|2|0-1|(null)|$D/dev/nvidia1,$D/dev/nvidia-caps/nvidia-cap${c%,*},$D/dev/nvidia-caps/nvidia-cap${c#*,}"
		done
	} > "$D/etc/fake_gpus.conf" ;;
autodetect-files)
	# A common site file: AutoDetect plus the types and files it should find.
	gres=gpu:tesla_t4:4
	printf 'AutoDetect=nvml\nName=gpu Type=tesla_t4 File=%s/dev/nvidia[0-3]\n' "$D" > "$D/etc/gres.conf"
	printf 'tesla_t4|2|0-1|0,0,-1,0|%s/dev/nvidia0\ntesla_t4|2|0-1|0,0,0,-1|%s/dev/nvidia1\ntesla_t4|2|0-1|-1,0,0,0|%s/dev/nvidia2\ntesla_t4|2|0-1|0,-1,0,0|%s/dev/nvidia3\n' "$D" "$D" "$D" "$D" > "$D/etc/fake_gpus.conf" ;;
nodename)
	printf 'NodeName=other Name=gpu File=%s/dev/nvidia[0-1]\nNodeName=gfnode,other2 Name=gpu File=%s/dev/nvidia[2-3]\nNodeName=gfnode Name=gpu File=%s/dev/nvidia[0-1]\n' "$D" "$D" "$D" > "$D/etc/gres.conf" ;;
mps)
	gres=gpu:4,mps:400; types=gpu,mps
	printf 'Name=gpu File=%s/dev/nvidia[0-3]\nName=mps Count=400 File=%s/dev/nvidia[0-3]\n' "$D" "$D" > "$D/etc/gres.conf" ;;
shard)
	gres=gpu:4,shard:40; types=gpu,shard
	printf 'Name=gpu File=%s/dev/nvidia[0-3]\nName=shard Count=40 File=%s/dev/nvidia[0-3]\n' "$D" "$D" > "$D/etc/gres.conf" ;;
shard-partial)
	# Shards on GPUs 2 and 3 only.
	gres=gpu:4,shard:20; types=gpu,shard
	printf 'Name=gpu File=%s/dev/nvidia[0-3]\nName=shard Count=10 File=%s/dev/nvidia2\nName=shard Count=10 File=%s/dev/nvidia3\n' "$D" "$D" "$D" > "$D/etc/gres.conf" ;;
shard-multitype)
	# Slurm's GPU order is file order (nvidia2, nvidia3, nvidia0, nvidia1); shards on nvidia0 and nvidia3.
	gres=gpu:t4:2,gpu:a100:2,shard:20; types=gpu,shard
	printf 'Name=gpu Type=t4 File=%s/dev/nvidia[2-3]\nName=gpu Type=a100 File=%s/dev/nvidia[0-1]\nName=shard Count=10 File=%s/dev/nvidia0\nName=shard Count=10 File=%s/dev/nvidia3\n' "$D" "$D" "$D" "$D" > "$D/etc/gres.conf" ;;
mps-partial)
	# mps on GPU 1 only.
	gres=gpu:4,mps:100; types=gpu,mps
	printf 'Name=gpu File=%s/dev/nvidia[0-3]\nName=mps Count=100 File=%s/dev/nvidia1\n' "$D" "$D" > "$D/etc/gres.conf" ;;
nogpu)
	gres=
	: > "$D/etc/gres.conf" ;;
fewer)
	# slurm.conf says 2 GPUs, gres.conf names 4.
	gres=gpu:2
	echo "Name=gpu File=$D/dev/nvidia[0-3]" > "$D/etc/gres.conf" ;;
missing)
	echo "Name=gpu File=$D/dev/nvidia[0-4]" > "$D/etc/gres.conf" ;;
*) echo "unknown layout $L" >&2; exit 2 ;;
esac
cat > "$D/etc/slurm.conf" <<EOC
ClusterName=gfg
SlurmctldHost=gfnode(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=/var/tmp/slurmdg/munge/munge.socket
SlurmdSpoolDir=$D/state
SlurmdPidFile=$D/run/slurmd.pid
SlurmdLogFile=$D/logs/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
GresTypes=$types
NodeName=gfnode NodeAddr=127.0.0.1 CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 ${gres:+Gres=$gres }State=UNKNOWN
PartitionName=debug Nodes=gfnode Default=YES
EOC
printf 'CgroupPlugin=cgroup/v1\nConstrainDevices=no\n' > "$D/etc/cgroup.conf"
