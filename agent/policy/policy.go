// SPDX-License-Identifier: Apache-2.0

// Package policy decides which GPUs a job step may open. It is pure: no
// kernel, no files. The job prolog's list, which slurmd takes from the signed
// job credential, is the ceiling; a step can only narrow it.
package policy

import (
	"fmt"
	"github.com/gpufence/gpufence/agent/gpulist"
	"slices"
	"strconv"
)

// Slurm's special step ids (slurm.h).
const (
	InteractiveStep uint32 = 0xfffffffa
	BatchStep       uint32 = 0xfffffffb
	ExternStep      uint32 = 0xfffffffc
)

// StepName renders a step id the way Slurm prints it.
func StepName(step uint32) string {
	switch step {
	case InteractiveStep:
		return "interactive"
	case BatchStep:
		return "batch"
	case ExternStep:
		return "extern"
	}
	return strconv.FormatUint(uint64(step), 10)
}

// WholeJobStep reports whether a step gets all of the job's GPUs on the node.
// Slurm gives the batch, extern and interactive steps the job's whole
// allocation; their SLURM_STEP_GPUS is not set by Slurm, so a value there came
// from the user and is ignored.
func WholeJobStep(step uint32) bool {
	return step == BatchStep || step == ExternStep || step == InteractiveStep
}

// Job is what the agent knows of a job on this node from its prolog.
type Job struct {
	ID   uint32
	UID  uint32
	GPUs []int // the trusted ceiling, ascending
}

// Decision is the outcome for one step.
type Decision struct {
	GPUs []int
	// Note explains a narrowing the agent applied on its own (a forged or
	// inconsistent request); it is logged, not shown to the user.
	Note string
}

// ForStep decides the GPUs of step stepID of job (nil when no prolog was
// recorded). stepGPUs is SLURM_STEP_GPUS from the step's environment, nil when
// unset. The error text is shown to the user by Slurm.
func ForStep(job *Job, jobID, stepID uint32, stepGPUs *string) (Decision, error) {
	var requested []int
	if !WholeJobStep(stepID) && stepGPUs != nil {
		var err error
		if requested, err = gpulist.Parse(*stepGPUs); err != nil {
			return Decision{}, fmt.Errorf("SLURM_STEP_GPUS of step %d.%s: %w", jobID, StepName(stepID), err)
		}
	}
	if job == nil {
		if len(requested) > 0 {
			return Decision{}, fmt.Errorf("job %d has no trusted GPU list on this node (its job prolog never reached the gpufence agent: was the agent down when the job started, or slurmd not restarted after gpufence was installed?); refusing to start a GPU step", jobID)
		}
		return Decision{GPUs: []int{}, Note: noProlog(jobID)}, nil
	}
	if WholeJobStep(stepID) {
		return Decision{GPUs: slices.Clone(job.GPUs)}, nil
	}
	var d Decision
	d.GPUs = []int{}
	var outside []int
	for _, g := range requested {
		if slices.Contains(job.GPUs, g) {
			d.GPUs = append(d.GPUs, g)
		} else {
			outside = append(outside, g)
		}
	}
	if len(outside) > 0 {
		d.Note = fmt.Sprintf("step asked for GPUs %s outside the job's trusted list %q; they stay denied", gpulist.Format(outside), gpulist.Format(job.GPUs))
	}
	return d, nil
}

func noProlog(jobID uint32) string {
	return fmt.Sprintf("job %d has no prolog record on this node; the step gets no GPU", jobID)
}

// Devices is what holding one Slurm GPU index opens: a whole GPU's device
// minor (/dev/nvidiaN), or for a MIG slice its parent GPU's minor and the
// nvidia-caps minors of its GPU and compute instances. The slices of one GPU
// share its minor; only their caps keep them apart.
type Devices struct {
	GPUMinor   uint32
	CapsMinors []uint32
}

// DeviceSet is what a step may open: the union of its GPUs' devices,
// ascending and without repeats. nvidiactl, nvidia-uvm and the other
// devices CUDA needs are not narrowed and so not listed.
type DeviceSet struct {
	GPUMinors  []uint32
	CapsMinors []uint32
}

// DevicesFor returns the devices of the GPU indices gpus (a step's
// decision) from the node's table. An index the table lacks is an error:
// the agent never guesses which device a GPU is.
func DevicesFor(table map[int]Devices, gpus []int) (DeviceSet, error) {
	set := DeviceSet{GPUMinors: []uint32{}, CapsMinors: []uint32{}}
	for _, g := range gpus {
		d, ok := table[g]
		if !ok {
			return DeviceSet{}, fmt.Errorf("GPU %d is not in this node's GPU table (gres.conf)", g)
		}
		set.GPUMinors = append(set.GPUMinors, d.GPUMinor)
		set.CapsMinors = append(set.CapsMinors, d.CapsMinors...)
	}
	slices.Sort(set.GPUMinors)
	slices.Sort(set.CapsMinors)
	set.GPUMinors = slices.Compact(set.GPUMinors)
	set.CapsMinors = slices.Compact(set.CapsMinors)
	return set, nil
}

// ForTask decides the GPUs of one task of a step holding stepGPUs
// (ascending), whose binding is visible: CUDA_VISIBLE_DEVICES as the task
// has it after Slurm set its per-task GPUs (nil: unset). The result only
// ever narrows within stepGPUs: an index the step does not hold is
// dropped, and a value that is not a GPU index list (UUIDs, MIG names,
// junk) keeps the step's list, since nothing in it can be read as a
// binding. note, when set, says what was dropped or kept.
func ForTask(stepGPUs []int, visible *string) (gpus []int, note string) {
	if visible == nil {
		return slices.Clone(stepGPUs), "CUDA_VISIBLE_DEVICES is unset: the task keeps its step's GPUs"
	}
	bound, err := gpulist.Parse(*visible)
	if err != nil {
		return slices.Clone(stepGPUs), fmt.Sprintf("CUDA_VISIBLE_DEVICES=%.64q is not a GPU index list (%v): the task keeps its step's GPUs", *visible, err)
	}
	gpus = []int{}
	var outside []int
	for _, g := range bound {
		if _, in := slices.BinarySearch(stepGPUs, g); in {
			gpus = append(gpus, g)
		} else {
			outside = append(outside, g)
		}
	}
	if len(outside) > 0 {
		note = fmt.Sprintf("CUDA_VISIBLE_DEVICES names GPUs [%s] the step does not hold; dropped", gpulist.Format(outside))
	}
	return gpus, note
}
