#!/bin/bash
# Runs INSIDE the throw-away VM (tests/vm/run-in-vm.sh): task_binding on a
# production-like node (pure cgroup v2, systemd, Slurm 22.05), where
# ConstrainRAMSpace=yes gives each task a cgroup of its own (22.05 to 24.05
# put tasks in one for the memory controller, not for cpuset; the e2e host's
# hybrid cgroup2 has neither controller). Run
# from the tree:
#
#   make build && CGO_ENABLED=0 go build -o bin/gf-open ./tests/cmd/gf-open
#   tests/vm/run-in-vm.sh tests/vm/binding-systemd.sh bin/gpufence bin/spank_gpufence.so \
#       bin/gf-open packaging/systemd/gpufence.service packaging/systemd/gpufence.socket
#
# Each srun -n2 shape runs under ConstrainDevices=yes with no gpufence (the
# oracle), then under gpufence (ConstrainDevices=no) with task_binding:
# slurm and step. It fails when a slurm-mode task opens other GPUs than the
# oracle's task of the same rank, a step-mode task other than its step's
# allocation, or any task a GPU outside it.
# SPDX-License-Identifier: Apache-2.0
set -u
fail=0
uname -r; echo "PID1: $(cat /proc/1/comm)"
. /host/fake-node.sh
shipped_gpufence_node
P="/dev/nvidia0 /dev/nvidia1 /dev/nvidia2 /dev/nvidia3"
idle() { for i in $(seq 120); do [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] && return; sleep 1; done; echo "node not idle"; sinfo; }
cgconf() { printf 'CgroupPlugin=cgroup/v2\nConstrainRAMSpace=yes\nConstrainDevices=%s\n' "$1" > /etc/slurm/cgroup.conf; }
# name | alloc | env | srun args
SHAPES=(
	"gpus-per-task=1|0 1||-n2 --gpus-per-task=1"
	"single:1|0 1||-n2 --gpus=2 --gpu-bind=single:1"
	"map_gpu:1,0|0 1||-n2 --gpus=2 --gpu-bind=map_gpu:1,0"
	"per_task:1|0 1||-n2 --gpus=2 --gpu-bind=per_task:1"
	"none|0 1||-n2 --gpus=2 --gpu-bind=none"
	"plain --gpus=2|0 1||-n2 --gpus=2"
	"forged single:1|0 1|CUDA_VISIBLE_DEVICES=0,1,2,3 SLURMD_TRES_BIND=gres/gpu:none SLURM_STEP_GPUS=0,1,2,3|-n2 --gpus=2 --gpu-bind=single:1"
	"forged --gpus=1 map_gpu|0|SLURM_GPU_BIND=map_gpu:0,1,2,3 CUDA_VISIBLE_DEVICES=0,1,2,3 SLURMD_TRES_BIND=gres/gpu:map_gpu:0,1,2,3|-n2 --gpus=1"
	"forged gpus-per-task env|0 1|SLURM_GPUS_PER_TASK=1 SLURM_GPU_BIND=map_gpu:3,2 CUDA_VISIBLE_DEVICES=2,3|-n2 --gpus=2"
)
declare -A RES
# run MODE: every shape once; RES[MODE|shape|rank] = the GPUs that opened.
run() {
	local mode=$1 s name alloc env args d r
	for s in "${SHAPES[@]}"; do
		IFS='|' read -r name alloc env args <<<"$s"
		d=$(mktemp -d /tmp/bind.XXXXXX); chmod 0777 "$d"
		if ! su alice -c "env $env srun $args -o $d/t.%t /usr/lib/gpufence/gf-open -env $P" >"$d/srun.out" 2>&1; then
			echo "FAIL: $mode: $name: srun failed"; cat "$d/srun.out"; fail=1; continue
		fi
		for r in 0 1; do
			RES[$mode|$name|$r]=$(grep -E '^/dev/nvidia[0-3] ENXIO' "$d/t.$r" | sed 's|/dev/nvidia\([0-9]\).*|\1|' | tr '\n' ' ' | sed 's/ $//')
			CG[$mode|$name|$r]=$(sed -n 's/^cgroup 0::.*\/\(user\/[^/]*\)$/\1/p' "$d/t.$r")
			CVD[$mode|$name|$r]=$(sed -n 's/^env CUDA_VISIBLE_DEVICES=//p' "$d/t.$r")
		done
	done
}
declare -A CG CVD
mode_agent() { printf 'task_binding: %s\n' "$1" > /etc/gpufence/agent.yaml; systemctl restart gpufence; sleep 1; systemctl is-active gpufence >/dev/null || { echo "FAIL: agent did not start"; journalctl -u gpufence | tail; fail=1; }; }

mkdir -p /etc/gpufence
idle; cgconf no; systemctl restart slurmd; idle
# ms MODE: wall time of srun -n2 with a binding, 6 runs (the first warms up).
declare -A MS
ms() {
	local i t0 t1 out=""
	for i in 0 1 2 3 4 5; do
		t0=$(date +%s%N); su alice -c "srun -n2 --gpus=2 --gpu-bind=single:1 true" || { echo "FAIL: timing srun ($1)"; fail=1; }; t1=$(date +%s%N)
		[ "$i" = 0 ] || out="$out $(( (t1 - t0) / 1000000 ))"
	done
	MS[$1]="${MS[$1]:-}$out"
}
for mode in slurm step; do mode_agent "$mode"; idle; run "$mode"; ms "$mode"; done
mode_agent slurm; idle; ms slurm
med() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "srun -n2 --gpus=2 --gpu-bind=single:1 true (emulated guest), ms: step${MS[step]}; slurm${MS[slurm]}; median step $(med "${MS[step]}"), slurm $(med "${MS[slurm]}")"
journalctl -u gpufence --no-pager | grep -c "task policy applied" | sed 's/^/agent: task policy applied lines: /'
# The oracle: no gpufence (agent stopped, pins gone: the filter is
# detached; no plugin), Slurm's own ConstrainDevices=yes.
systemctl stop gpufence gpufence.socket; rm -rf /sys/fs/bpf/gpufence
: > /etc/slurm/plugstack.conf
cgconf yes; systemctl restart slurmd; idle
run cd

printf '%-26s %-6s %-26s %-26s %-26s\n' shape alloc "ConstrainDevices=yes" "task_binding: slurm" "task_binding: step"
for s in "${SHAPES[@]}"; do
	IFS='|' read -r name alloc env args <<<"$s"
	row=()
	for m in cd slurm step; do row+=("[${RES[$m|$name|0]}] [${RES[$m|$name|1]}]"); done
	printf '%-26s %-6s %-26s %-26s %-26s\n' "$name" "$alloc" "${row[@]}"
	printf '%-26s %-6s %-26s %-26s %-26s\n' "" "cvd" "${CVD[cd|$name|0]} ${CVD[cd|$name|1]}" "${CVD[slurm|$name|0]} ${CVD[slurm|$name|1]}" "${CVD[step|$name|0]} ${CVD[step|$name|1]}"
	for r in 0 1; do
		for m in cd slurm step; do
			for g in ${RES[$m|$name|$r]}; do
				case " $alloc " in *" $g "*) ;; *) echo "FAIL: $name: $m: task $r opened GPU $g outside its step's [$alloc]"; fail=1;; esac
			done
		done
		[ "${CG[slurm|$name|$r]}" = "user/task_$r" ] || { echo "FAIL: $name: slurm: task $r ran in ${CG[slurm|$name|$r]}, want user/task_$r"; fail=1; }
		[ "${RES[slurm|$name|$r]}" = "${RES[cd|$name|$r]}" ] || { echo "FAIL: $name: task_binding: slurm: task $r opened [${RES[slurm|$name|$r]}], ConstrainDevices=yes [${RES[cd|$name|$r]}]"; fail=1; }
		[ "${RES[step|$name|$r]}" = "$alloc" ] || { echo "FAIL: $name: task_binding: step: task $r opened [${RES[step|$name|$r]}], want its step's [$alloc]"; fail=1; }
	done
done
[ "$fail" = 0 ] && echo "PASS" || echo "FAILED"
exit "$fail"
