// SPDX-License-Identifier: Apache-2.0

package audit

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// journalSink sends records to journald over its native protocol, one
// datagram per record, with each field as a journal field. It speaks the
// protocol itself (as go-systemd/journal does) so that the socket path can
// be a journald namespace's socket.
type journalSink struct {
	addr *net.UnixAddr
	conn *net.UnixConn
}

func openJournal(path string) (*journalSink, error) {
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("open datagram socket for %s: %w", path, err)
	}
	return &journalSink{addr: &net.UnixAddr{Name: path, Net: "unixgram"}, conn: conn}, nil
}

func (s *journalSink) Name() string { return "journald" }

func (s *journalSink) Write(r *Record) error {
	_ = s.conn.SetWriteDeadline(time.Now().Add(time.Second))
	if _, err := s.conn.WriteToUnix(encodeJournal(journalFields(r)), s.addr); err != nil {
		return fmt.Errorf("send to journald at %s: %w", s.addr.Name, err)
	}
	return nil
}

func (s *journalSink) Close() error { return s.conn.Close() }

type journalField struct{ Name, Value string }

// priority maps a severity to syslog(3)/journald PRIORITY.
func priority(s Severity) int {
	switch s {
	case SeverityError:
		return 3
	case SeverityWarning:
		return 4
	case SeverityNotice:
		return 5
	}
	return 6
}

// journalFields maps a record to journal fields (docs/audit.md lists them).
func journalFields(r *Record) []journalField {
	f := []journalField{
		{"MESSAGE", r.Message},
		{"PRIORITY", strconv.Itoa(priority(r.Severity))},
		{"SYSLOG_IDENTIFIER", "gpufence"},
		{"GPUFENCE_SCHEMA_VERSION", r.SchemaVersion},
		{"GPUFENCE_SEQ", strconv.FormatUint(r.Seq, 10)},
		{"GPUFENCE_RUN_ID", r.RunID},
		{"GPUFENCE_BOOT_ID", r.BootID},
		{"GPUFENCE_TIME", r.Time.UTC().Format(time.RFC3339Nano)},
		{"GPUFENCE_EVENT", string(r.Event)},
		{"GPUFENCE_SEVERITY", string(r.Severity)},
		{"GPUFENCE_NODE", r.Node},
		{"GPUFENCE_CLUSTER", r.Cluster},
		{"GPUFENCE_AGENT_VERSION", r.AgentVersion},
	}
	add := func(name, v string) {
		if v != "" {
			f = append(f, journalField{name, v})
		}
	}
	num := func(name string, v uint64) {
		if v != 0 {
			f = append(f, journalField{name, strconv.FormatUint(v, 10)})
		}
	}
	if h := r.Host; h != nil {
		add("GPUFENCE_MACHINE_ID", h.MachineID)
		add("GPUFENCE_FQDN", h.FQDN)
		add("GPUFENCE_EC2_INSTANCE_ID", h.EC2InstanceID)
	}
	if !r.AccessTime.IsZero() {
		add("GPUFENCE_ACCESS_TIME", r.AccessTime.UTC().Format(time.RFC3339Nano))
	}
	add("GPUFENCE_DECISION", r.Decision)
	add("GPUFENCE_POLICY_MODE", r.PolicyMode)
	num("GPUFENCE_JOB_ID", uint64(r.JobID))
	add("GPUFENCE_STEP_ID", r.StepID)
	add("GPUFENCE_USER", r.User)
	if r.UID != nil {
		f = append(f, journalField{"GPUFENCE_UID", strconv.FormatUint(uint64(*r.UID), 10)})
	}
	num("GPUFENCE_PID", uint64(r.PID))
	add("GPUFENCE_COMM", r.Comm)
	add("GPUFENCE_EXE", r.Exe)
	add("GPUFENCE_EXE_STATUS", r.ExeStatus)
	add("GPUFENCE_EXE_NOW", r.ExeNow)
	add("GPUFENCE_EXE_NAMESPACE_PATH", r.ExeNamespacePath)
	num("GPUFENCE_EXE_MNT_NS", r.ExeMntNS)
	add("GPUFENCE_EXE_DEV", r.ExeDev)
	num("GPUFENCE_EXE_INO", r.ExeIno)
	if r.Device != nil {
		add("GPUFENCE_DEVICE_PATH", r.Device.Path)
		add("GPUFENCE_DEVICE_KIND", r.Device.Kind)
		f = append(f, journalField{"GPUFENCE_DEVICE", fmt.Sprintf("%d:%d", r.Device.Major, r.Device.Minor)})
	}
	if r.GPU != nil {
		f = append(f, journalField{"GPUFENCE_GPU_INDEX", strconv.Itoa(r.GPU.Index)})
		add("GPUFENCE_GPU_UUID", r.GPU.UUID)
		if r.GPU.MIG != nil {
			f = append(f, journalField{"GPUFENCE_GPU_MIG", "1"})
			add("GPUFENCE_GPU_MIG_PROFILE", r.GPU.MIG.Profile)
		}
	}
	add("GPUFENCE_ACCESS", strings.Join(r.Access, ","))
	num("GPUFENCE_SUPPRESSED", r.Suppressed)
	num("GPUFENCE_CGROUP_ID", r.CgroupID)
	if r.GPUs != nil {
		s := make([]string, len(r.GPUs))
		for i, g := range r.GPUs {
			s[i] = strconv.Itoa(g)
		}
		f = append(f, journalField{"GPUFENCE_GPUS", strings.Join(s, ",")})
	}
	if len(r.Shares) > 0 {
		s := make([]string, len(r.Shares))
		for i, sh := range r.Shares {
			s[i] = sh.String()
		}
		f = append(f, journalField{"GPUFENCE_SHARES", strings.Join(s, ", ")})
	}
	add("GPUFENCE_CGROUP", r.Cgroup)
	add("GPUFENCE_REASON", r.Reason)
	add("GPUFENCE_ERROR", r.Error)
	num("GPUFENCE_IDLE_SECONDS", r.IdleSeconds)
	num("GPUFENCE_IDLE_THRESHOLD", uint64(r.IdleThreshold))
	if r.Loss != nil {
		b, _ := json.Marshal(r.Loss)
		f = append(f, journalField{"GPUFENCE_LOSS", string(b)})
	}
	b, _ := json.Marshal(r)
	f = append(f, journalField{"GPUFENCE_RECORD", string(b)})
	return f
}

// encodeJournal writes fields in journald's native format: NAME=value\n, or
// for values with a newline NAME\n, a 64-bit little-endian length, the value, \n.
func encodeJournal(fields []journalField) []byte {
	var b bytes.Buffer
	for _, f := range fields {
		if strings.Contains(f.Value, "\n") {
			b.WriteString(f.Name)
			b.WriteByte('\n')
			_ = binary.Write(&b, binary.LittleEndian, uint64(len(f.Value)))
			b.WriteString(f.Value)
			b.WriteByte('\n')
			continue
		}
		b.WriteString(f.Name)
		b.WriteByte('=')
		b.WriteString(f.Value)
		b.WriteByte('\n')
	}
	return b.Bytes()
}
