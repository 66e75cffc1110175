// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"strings"
	"testing"
	"time"
)

func multiParams() confParams {
	p := testParams()
	p.Nodes = []confNode{{Name: "n1", Port: 7002, FirstMinor: 0}, {Name: "n2", Port: 7010, FirstMinor: 4}}
	return p
}

func TestRenderMultiNode(t *testing.T) {
	slurmConf := renderSlurmConf(multiParams())
	for _, want := range []string{
		"SlurmdSpoolDir=/var/tmp/r/state/d/%n\n",
		"SlurmdPidFile=/var/tmp/r/run/slurmd-%n.pid\n",
		"SlurmdLogFile=/var/tmp/r/logs/slurmd-%n.log\n",
		"NodeName=n1 NodeHostname=node1 NodeAddr=127.0.0.1 Port=7002 CPUs=2 Gres=gpu:4 State=UNKNOWN\n",
		"NodeName=n2 NodeHostname=node1 NodeAddr=127.0.0.1 Port=7010 CPUs=2 Gres=gpu:4 State=UNKNOWN\n",
		"PartitionName=debug Nodes=n1,n2 Default=YES",
	} {
		if !strings.Contains(slurmConf, want) {
			t.Errorf("slurm.conf lacks %q:\n%s", want, slurmConf)
		}
	}
	if strings.Contains(slurmConf, "NodeName=node1") {
		t.Errorf("slurm.conf of a multi-node cluster names the host as a node:\n%s", slurmConf)
	}
	for _, tc := range []struct {
		name string
		got  string
		want string
	}{
		{"gres.conf", renderGresConf(multiParams()),
			"NodeName=n1 Name=gpu File=/var/tmp/r/dev/nvidia[0-3]\nNodeName=n2 Name=gpu File=/var/tmp/r/dev/nvidia[4-7]\n"},
		{"ParallelCluster's gres file", renderPClusterGres(multiParams()),
			"NodeName=n1 Name=gpu Type=a10g File=/var/tmp/r/dev/nvidia[0-3]\nNodeName=n2 Name=gpu Type=a10g File=/var/tmp/r/dev/nvidia[4-7]\n"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s:\n%s\nwant:\n%s", tc.name, tc.got, tc.want)
		}
	}
}

func TestCheckNodes(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		kind string
		ok   bool
	}{
		{Options{}, "debroot", true},
		{Options{Nodes: 1, MIG: true}, "host", true},
		{Options{Nodes: 2, GPUs: 4}, "host", true},
		{Options{Nodes: 2, GPUs: 4}, "source", true},
		{Options{Nodes: 2, GPUs: 4}, "debroot", false},
		{Options{Nodes: 2, GPUs: 4, MIG: true}, "host", false},
		{Options{Nodes: 9, GPUs: 4}, "host", false},
		{Options{Nodes: 8, GPUs: 9}, "host", false},
	} {
		if err := checkNodes(tc.o, tc.kind); (err == nil) != tc.ok {
			t.Errorf("checkNodes(%+v, %s) = %v, want ok=%v", tc.o, tc.kind, err, tc.ok)
		}
	}
}

func TestNodesIn(t *testing.T) {
	sinfo := "n1 idle\nn2 mix\n"
	for _, tc := range []struct {
		names, states []string
		want          bool
	}{
		{[]string{"n1"}, []string{"idle"}, true},
		{[]string{"n1", "n2"}, []string{"idle"}, false},
		{[]string{"n1", "n2"}, []string{"idle", "mix"}, true},
		{[]string{"n3"}, []string{"idle"}, false},
	} {
		if got := nodesIn(sinfo, tc.names, tc.states); got != tc.want {
			t.Errorf("nodesIn(%v, %v) = %v, want %v", tc.names, tc.states, got, tc.want)
		}
	}
}

func TestRegisteredSince(t *testing.T) {
	show := "NodeName=n1 Arch=x86_64 SlurmdStartTime=2026-12-02T01:29:48 LastBusyTime=2026-12-02T01:30:51\n" +
		"NodeName=n2 Arch=x86_64 SlurmdStartTime=2026-12-02T01:30:58 LastBusyTime=2026-12-02T01:30:51\n"
	at := func(s string) time.Time {
		v, err := time.ParseInLocation("2006-01-02T15:04:05.000", s, time.Local)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		names []string
		since time.Time
		want  bool
	}{
		// slurmctld has seconds: a start within the second counts.
		{[]string{"n2"}, at("2026-12-02T01:30:58.700"), true},
		{[]string{"n2"}, at("2026-12-02T01:30:59.100"), false},
		{[]string{"n1", "n2"}, at("2026-12-02T01:30:58.000"), false},
		{[]string{"n1", "n2"}, at("2026-12-02T01:29:00.000"), true},
		{[]string{"n3"}, at("2026-12-02T01:29:00.000"), false},
	} {
		if got := registeredSince(show, tc.names, tc.since); got != tc.want {
			t.Errorf("registeredSince(%v, %v) = %v, want %v", tc.names, tc.since, got, tc.want)
		}
	}
}
