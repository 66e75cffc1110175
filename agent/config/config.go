// SPDX-License-Identifier: Apache-2.0

// Package config holds the agent's settings: documented defaults, then the
// file (/etc/gpufence/agent.yaml), then command-line flags. Every field is
// validated at start and an error names the field and the file.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/gpufence/gpufence/agent/audit"
)

// DefaultPath is where packages install the configuration file.
const DefaultPath = "/etc/gpufence/agent.yaml"

// Modes of attaching the device filter.
const (
	ModeAuto      = "auto"
	ModeScope     = "scope"
	ModePerCgroup = "per-cgroup"
)

// Config is the agent's configuration. The yaml names are the file's keys.
type Config struct {
	// Socket is the unix socket the SPANK plugin connects to.
	Socket string `yaml:"socket"`
	// SlurmConf is Slurm's slurm.conf; gres.conf and cgroup.conf are read
	// from the same folder.
	SlurmConf string `yaml:"slurm_conf"`
	// SlurmBinDir holds scontrol and squeue, with which the agent asks
	// slurmctld about jobs (recover_from_slurmctld, and whether a job whose
	// epilog it missed has ended); empty: <prefix>/bin when slurm_conf is
	// <prefix>/etc/slurm.conf and scontrol is there (ParallelCluster's
	// /opt/slurm), else PATH.
	SlurmBinDir string `yaml:"slurm_bin_dir"`
	// SlurmdGPUTable is auto (the GPU table is slurmd's own, from
	// `slurmd -G` with slurm_conf and node_name, cross-checked with
	// gres.conf; when it fails, gres.conf's alone unless gres.conf uses
	// AutoDetect), required (refuse to start when slurmd -G fails) or off
	// (gres.conf only).
	SlurmdGPUTable string `yaml:"slurmd_gpu_table"`
	// Slurmd is the slurmd binary run as slurmd -G; empty: next to
	// slurm_bin_dir (../sbin, or the folder itself), else
	// <prefix>/sbin/slurmd when slurm_conf is <prefix>/etc/slurm.conf,
	// else /usr/sbin or /usr/local/sbin (slurm.SlurmdPath). PATH is never
	// searched: the agent runs it as root.
	Slurmd string `yaml:"slurmd"`
	// NodeName is this node's name in gres.conf (slurmd's -N); default the
	// short host name.
	NodeName string `yaml:"node_name"`
	// Scope is the cgroup directory of Slurm's slurmstepd scope; empty means
	// found where slurmd makes it (jobcgroup.Find: <CgroupSlice>/
	// [<node>_]slurmstepd.scope, root's, holding Slurm's processes), or from
	// the first step's own cgroup.
	Scope string `yaml:"scope"`
	// Mode is auto, scope (one filter on the scope, kernel >= 6.1) or
	// per-cgroup (one filter per step cgroup, older kernels).
	Mode string `yaml:"mode"`
	// NvidiaMajor overrides the NVIDIA char major; 0 reads /proc/devices,
	// falling back to 195.
	NvidiaMajor uint32 `yaml:"nvidia_major"`
	// NvidiaCapsMajor overrides the char major of the MIG capability
	// devices (/dev/nvidia-caps/nvidia-cap*); 0 reads "nvidia-caps" from
	// /proc/devices (the kernel hands it out at driver load, there is no
	// standard value). Unknown, that major is not narrowed and a gres.conf
	// with MIG slices is refused.
	NvidiaCapsMajor uint32 `yaml:"nvidia_caps_major"`
	// FabricManagement is deny (job steps may not open the NVSwitch and
	// NVLink management nodes, /dev/nvidia-nvswitchctl, /dev/nvidia-nvswitchN
	// and /dev/nvidia-nvlink, and each attempt is audited: only the fabric
	// manager uses them) or allow (not narrowed).
	FabricManagement string `yaml:"fabric_management"`
	// NVSwitchMajor and NVLinkMajor override the char majors of those
	// nodes; 0 reads "nvidia-nvswitch" and "nvidia-nvlink" from
	// /proc/devices (dynamic majors). Unknown: nothing of it to deny.
	NVSwitchMajor uint32 `yaml:"nvswitch_major"`
	NVLinkMajor   uint32 `yaml:"nvlink_major"`
	// IMEXChannels is how IMEX channel devices
	// (/dev/nvidia-caps-imex-channels/channelN) are narrowed: slurm (each
	// GPU step opens only the channel Slurm's switch/nvidia_imex made for
	// its job), none (no job opens any), unrestricted (not narrowed), or
	// auto (slurm when slurm.conf says SwitchType=switch/nvidia_imex, else
	// unrestricted).
	IMEXChannels string `yaml:"imex_channels"`
	// IMEXChannelsMajor overrides the char major of the channel devices; 0
	// takes slurm.conf's SwitchParameters=imex_dev_major=, else
	// "nvidia-caps-imex-channels" from /proc/devices. Unknown: not narrowed.
	IMEXChannelsMajor uint32 `yaml:"imex_channels_major"`
	// TaskBinding is step (every task of a step opens the step's GPUs, as
	// without ConstrainDevices, which NCCL's peer-to-peer transport between
	// the tasks of a node needs) or slurm (each task opens only the GPUs
	// Slurm binds it to, --gpus-per-task or --gpu-bind, as ConstrainDevices
	// would give it; scope mode only).
	TaskBinding string `yaml:"task_binding"`
	// ExemptCgroups are the scope's children that are not jobs and keep every
	// device for root: Slurm parks new slurmstepds in "system" and, without
	// systemd, moves slurmd into "slurmd" (both use NVML as root).
	ExemptCgroups []string `yaml:"exempt_cgroups"`
	// RequestTimeout bounds one plugin exchange inside the agent.
	RequestTimeout Duration `yaml:"request_timeout"`
	// ReconcileInterval is how often entries of vanished cgroups are removed.
	ReconcileInterval Duration `yaml:"reconcile_interval"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log_level"`
	// LogFormat is text or json.
	LogFormat string `yaml:"log_format"`
	// ClusterName names the cluster in audit records; default Slurm's
	// ClusterName from slurm.conf.
	ClusterName string `yaml:"cluster_name"`
	// Enforcement is enforce (deny) or audit-only (allow everything and
	// record what would have been denied; for rollouts).
	Enforcement string `yaml:"enforcement"`
	// Audit configures the audit trail.
	Audit Audit `yaml:"audit"`
	// PinDir is where the filter's program, link and maps are pinned in
	// bpffs so enforcement outlives the agent; empty detaches at stop.
	PinDir string `yaml:"pin_dir"`
	// StateFile is a copy of the records (which job and step each kernel
	// entry belongs to), written after changes for gpufence status. The
	// records themselves outlive the agent in the store pinned in PinDir;
	// the file is read at start only where there is no store yet (an older
	// agent's file, or PinDir empty). Empty: no copy.
	StateFile string `yaml:"state_file"`
	// RecoverFromSlurmctld asks slurmctld for the GPUs of a job whose prolog
	// record is missing (agent down at job start, state lost), instead of
	// giving its steps no GPU. Only output no job user can steer is read:
	// JSON where the release prints it, else strictly structured text.
	RecoverFromSlurmctld bool `yaml:"recover_from_slurmctld"`
	// AdoptUnconfirmed is how a job found running with no record at start
	// is handled when slurmctld cannot be asked about it (its client could
	// not connect): deny (the default: no GPU) or audit-only (its steps
	// open any GPU, each open audited, for at most AdoptUnconfirmedMax),
	// until slurmctld confirms it or it ends. A job slurmctld confirms
	// keeps its GPUs; one it refuses, or whose answer is slow or cannot be
	// used, gets none, whatever this says.
	AdoptUnconfirmed string `yaml:"adopt_unconfirmed"`
	// AdoptUnconfirmedMax bounds how long an audit-only unconfirmed job
	// may open any GPU: past it (counted from its adoption) it is denied
	// until slurmctld confirms it.
	AdoptUnconfirmedMax Duration `yaml:"adopt_unconfirmed_max"`
	// FailOpenSpool is where the SPANK plugin (failure=open, spool=) records
	// steps it let run without isolation; the agent audits and removes them.
	FailOpenSpool string `yaml:"failopen_spool"`
	// NVML is auto (check gres.conf against the NVIDIA driver when there is
	// one), required (refuse to start without it) or off (gres.conf only).
	NVML string `yaml:"nvml"`
	// Metrics configures the Prometheus endpoint and GPU sampling
	// (docs/metrics.md).
	Metrics Metrics `yaml:"metrics"`
	// DCGMJobMappingDir is where the agent keeps dcgm-exporter's HPC job
	// mapping files (its --hpc-job-mapping-dir); empty writes none.
	DCGMJobMappingDir string `yaml:"dcgm_job_mapping_dir"`
}

// Metrics configures what the agent exports to Prometheus.
type Metrics struct {
	// Listen is the host:port of the HTTP endpoint (/metrics, /healthz);
	// empty disables it. Localhost by default: every local user can reach
	// it, so without WebConfig it serves node aggregates only.
	Listen string `yaml:"listen"`
	// WebConfig is a Prometheus exporter-toolkit web configuration file
	// (TLS, client certificates, basic auth with bcrypt hashes). Set, every
	// request must authenticate by it, and only then are the per-job and
	// per-user series (and the agent's process figures) served; empty,
	// nothing names a job or a user (Slurm's PrivateData).
	WebConfig string `yaml:"web_config"`
	// MaxConnections bounds the endpoint's open connections; the agent
	// cuts it to a quarter of its open-files limit, so the plugin's socket
	// keeps descriptors whatever local users hold.
	MaxConnections int `yaml:"max_connections"`
	// SampleInterval is how often GPU utilization and memory are read
	// through NVML.
	SampleInterval Duration `yaml:"sample_interval"`
	// IdleThreshold is the utilization, in percent, below which an
	// allocated GPU counts as idle.
	IdleThreshold uint32 `yaml:"idle_threshold"`
	// IdleAuditAfter is how long a job may hold an idle GPU before a gpu_idle
	// audit record is written; 0 writes none.
	IdleAuditAfter Duration `yaml:"idle_audit_after"`
}

// Audit configures where GPU access decisions are recorded.
type Audit struct {
	// File is the JSON Lines audit file; empty disables it.
	File string `yaml:"file"`
	// Journald is auto (when journald runs), on or off.
	Journald string `yaml:"journald"`
	// Syslog is empty (off), unix:///dev/log, unixgram:///path or
	// tcp://host:port; records go out as RFC 5424.
	Syslog string `yaml:"syslog"`
	// Allowed is which allowed accesses are recorded: none, first (the
	// first per job step and device) or all.
	Allowed string `yaml:"allowed"`
	// RateWindow and RateBurst bound, in the kernel, how many records one
	// job step, device and decision produces: RateBurst per RateWindow; the
	// rest are counted exactly and reported as suppressed.
	RateWindow Duration `yaml:"rate_window"`
	RateBurst  uint32   `yaml:"rate_burst"`
	// FlushInterval is how often suppressed counts no later record carried
	// are reported.
	FlushInterval Duration `yaml:"flush_interval"`
	// QueueSize bounds the records waiting for the sinks; a full queue
	// drops and counts.
	QueueSize int `yaml:"queue_size"`
	// EC2InstanceID is whether the agent asks EC2's metadata service
	// (IMDSv2) for the instance id, once at start, for every record's
	// host: auto (where the firmware says Amazon EC2), on, off.
	EC2InstanceID string `yaml:"ec2_instance_id"`
	// IMDSEndpoint is the metadata service's base URL.
	IMDSEndpoint string `yaml:"imds_endpoint"`
	// SyslogTLSCA, SyslogTLSCert, SyslogTLSKey and SyslogTLSServerName
	// configure a tls:// syslog target (RFC 5425): the CA file that
	// checks the collector's certificate (the system's roots when empty),
	// a client certificate and key when the collector asks for one, the
	// name the certificate must carry (the target's host by default).
	SyslogTLSCA         string `yaml:"syslog_tls_ca"`
	SyslogTLSCert       string `yaml:"syslog_tls_cert"`
	SyslogTLSKey        string `yaml:"syslog_tls_key"`
	SyslogTLSServerName string `yaml:"syslog_tls_server_name"`
	// FileGroup is the audit file's group (name or number; empty: root's),
	// for a log forwarder that runs as its own user in that group.
	FileGroup string `yaml:"file_group"`
	// FileMode is the audit file's mode, in octal (default 0640).
	FileMode string `yaml:"file_mode"`
	// OCSFFile is a second audit file holding each record as one OCSF
	// event per line, with the same mode and group; empty (default): none.
	OCSFFile string `yaml:"ocsf_file"`
}

// AuditFileMode is audit.file_mode as a mode (Validate has checked it).
func (a Audit) AuditFileMode() os.FileMode {
	n, _ := strconv.ParseUint(a.FileMode, 8, 32)
	return os.FileMode(n)
}

// DefaultMetricsListen is where the metrics endpoint listens unless
// configured otherwise: localhost only, because per-job series carry user
// names.
const DefaultMetricsListen = "127.0.0.1:9945"

// DefaultMetricsMaxConnections is metrics.max_connections unless
// configured: a few scrapers and curl, with room to spare.
const DefaultMetricsMaxConnections = 64

// checkListen accepts host:port with a numeric port from 1 to 65535; the
// host may be empty (every address), a name or an IP.
func checkListen(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want host:port: %w", err)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}

// slurmd_gpu_table settings.
const (
	SlurmdGPUTableAuto     = "auto"
	SlurmdGPUTableRequired = "required"
	SlurmdGPUTableOff      = "off"
)

// NVML settings.
const (
	NVMLAuto     = "auto"
	NVMLRequired = "required"
	NVMLOff      = "off"
)

// IMEXChannels values.
const (
	IMEXAuto         = "auto"
	IMEXSlurm        = "slurm"
	IMEXNone         = "none"
	IMEXUnrestricted = "unrestricted"
)

// TaskBinding values.
const (
	TaskBindingStep  = "step"
	TaskBindingSlurm = "slurm"
)

// AdoptUnconfirmed values.
const (
	AdoptAuditOnly = "audit-only"
	AdoptDeny      = "deny"
)

// FabricManagement values.
const (
	FabricDeny  = "deny"
	FabricAllow = "allow"
)

// Enforcement values.
const (
	EnforcementEnforce   = "enforce"
	EnforcementAuditOnly = "audit-only"
)

// Duration is a time.Duration written as "5s" in the file.
type Duration struct{ time.Duration }

// UnmarshalYAML parses Go duration syntax.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration like 5s or 1m", n.Line, s)
	}
	d.Duration = v
	return nil
}

// String renders the duration.
func (d Duration) String() string { return d.Duration.String() }

// Default returns the documented defaults.
func Default() Config {
	slurmConf := defaultSlurmConf(os.Getenv("SLURM_CONF"), slurmConfCandidates)
	host, _ := os.Hostname()
	host, _, _ = strings.Cut(host, ".")
	return Config{
		Socket:               "/run/gpufence/agent.sock",
		SlurmConf:            slurmConf,
		NodeName:             host,
		Mode:                 ModeAuto,
		FabricManagement:     FabricDeny,
		ExemptCgroups:        []string{"system", "slurmd"},
		RequestTimeout:       Duration{5 * time.Second},
		ReconcileInterval:    Duration{10 * time.Second},
		LogLevel:             "info",
		LogFormat:            "text",
		Enforcement:          EnforcementEnforce,
		PinDir:               "/sys/fs/bpf/gpufence",
		StateFile:            "/var/lib/gpufence/state.json",
		RecoverFromSlurmctld: true,
		AdoptUnconfirmed:     AdoptDeny,
		AdoptUnconfirmedMax:  Duration{10 * time.Minute},
		IMEXChannels:         IMEXAuto,
		TaskBinding:          TaskBindingStep,
		FailOpenSpool:        "/var/spool/gpufence/failopen.jsonl",
		NVML:                 NVMLAuto,
		SlurmdGPUTable:       SlurmdGPUTableAuto,
		Metrics: Metrics{
			Listen:         DefaultMetricsListen,
			MaxConnections: DefaultMetricsMaxConnections,
			SampleInterval: Duration{15 * time.Second},
			IdleThreshold:  5,
			IdleAuditAfter: Duration{time.Hour},
		},
		Audit: Audit{
			File:          "/var/log/gpufence/audit.jsonl",
			Journald:      "auto",
			Allowed:       "first",
			RateWindow:    Duration{time.Second},
			RateBurst:     5,
			FlushInterval: Duration{5 * time.Second},
			QueueSize:     4096,
			EC2InstanceID: "auto",
			FileMode:      "0640",
			IMDSEndpoint:  "http://169.254.169.254",
		},
	}
}

// slurmConfCandidates are where Slurm's packages put slurm.conf: Debian's and
// RPM builds' /etc/slurm, and ParallelCluster's /opt/slurm/etc (NFS-shared
// from the head node).
var slurmConfCandidates = []string{"/etc/slurm/slurm.conf", "/opt/slurm/etc/slurm.conf"}

// defaultSlurmConf is $SLURM_CONF when set (Slurm's own override), else the
// first candidate that exists, else the first candidate.
func defaultSlurmConf(env string, candidates []string) string {
	if env != "" {
		return env
	}
	for _, c := range candidates {
		if _, err := os.Stat(c); err == nil {
			return c
		}
	}
	return candidates[0]
}

// Load reads path over the defaults. A missing file at the default path is
// not an error (defaults apply); a missing file that was asked for is.
func Load(path string, explicit bool) (Config, error) {
	c := Default()
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist) && !explicit:
		return c, c.Validate("defaults")
	case err != nil:
		return c, fmt.Errorf("read config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, c.Validate(path)
}

// Validate checks every field; source names where the values came from.
func (c Config) Validate(source string) error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s: %s", source, field, fmt.Sprintf(format, args...)))
	}
	if !filepath.IsAbs(c.Socket) {
		bad("socket", "%q must be an absolute path", c.Socket)
	}
	if !filepath.IsAbs(c.SlurmConf) {
		bad("slurm_conf", "%q must be an absolute path", c.SlurmConf)
	}
	if c.NodeName == "" {
		bad("node_name", "empty, and the host name could not be read")
	}
	if c.SlurmBinDir != "" && !filepath.IsAbs(c.SlurmBinDir) {
		bad("slurm_bin_dir", "%q must be an absolute path", c.SlurmBinDir)
	}
	if c.Scope != "" && !filepath.IsAbs(c.Scope) {
		bad("scope", "%q must be an absolute cgroup directory", c.Scope)
	}
	switch c.Mode {
	case ModeAuto, ModeScope, ModePerCgroup:
	default:
		bad("mode", "%q is not one of auto, scope, per-cgroup", c.Mode)
	}
	if c.NvidiaMajor > 4095 {
		bad("nvidia_major", "%d is not a valid char major", c.NvidiaMajor)
	}
	if c.NvidiaCapsMajor > 4095 {
		bad("nvidia_caps_major", "%d is not a valid char major", c.NvidiaCapsMajor)
	} else if c.NvidiaCapsMajor != 0 && c.NvidiaCapsMajor == c.NvidiaMajor {
		bad("nvidia_caps_major", "%d is the same as nvidia_major", c.NvidiaCapsMajor)
	}
	switch c.FabricManagement {
	case FabricDeny, FabricAllow:
	default:
		bad("fabric_management", "%q is not one of deny, allow", c.FabricManagement)
	}
	for _, m := range []struct {
		key   string
		major uint32
	}{{"nvswitch_major", c.NVSwitchMajor}, {"nvlink_major", c.NVLinkMajor}} {
		switch {
		case m.major == 0:
		case m.major > 4095:
			bad(m.key, "%d is not a valid char major", m.major)
		case m.major == c.NvidiaMajor || (c.NvidiaMajor == 0 && m.major == 195):
			bad(m.key, "%d is the NVIDIA GPU major", m.major)
		case m.major == c.NvidiaCapsMajor:
			bad(m.key, "%d is the same as nvidia_caps_major", m.major)
		}
	}
	if c.NVSwitchMajor != 0 && c.NVSwitchMajor == c.NVLinkMajor {
		bad("nvlink_major", "%d is the same as nvswitch_major", c.NVLinkMajor)
	}
	switch c.IMEXChannels {
	case IMEXAuto, IMEXSlurm, IMEXNone, IMEXUnrestricted:
	default:
		bad("imex_channels", "%q is not one of auto, slurm, none, unrestricted", c.IMEXChannels)
	}
	switch c.TaskBinding {
	case TaskBindingStep, TaskBindingSlurm:
	default:
		bad("task_binding", "%q is not one of step, slurm", c.TaskBinding)
	}
	if c.IMEXChannelsMajor > 4095 {
		bad("imex_channels_major", "%d is not a valid char major", c.IMEXChannelsMajor)
	} else if c.IMEXChannelsMajor != 0 && (c.IMEXChannelsMajor == c.NvidiaMajor || c.IMEXChannelsMajor == c.NvidiaCapsMajor) {
		bad("imex_channels_major", "%d is the same as nvidia_major or nvidia_caps_major", c.IMEXChannelsMajor)
	} else if c.IMEXChannelsMajor != 0 && (c.IMEXChannelsMajor == c.NVSwitchMajor || c.IMEXChannelsMajor == c.NVLinkMajor) {
		bad("imex_channels_major", "%d is the same as nvswitch_major or nvlink_major", c.IMEXChannelsMajor)
	}
	for _, e := range c.ExemptCgroups {
		if e == "" || strings.ContainsRune(e, '/') || strings.HasPrefix(e, "job_") {
			bad("exempt_cgroups", "%q must be a plain directory name that is not a job", e)
		}
	}
	if c.RequestTimeout.Duration <= 0 || c.RequestTimeout.Duration > time.Minute {
		bad("request_timeout", "%s must be above 0 and at most 1m", c.RequestTimeout)
	}
	if c.ReconcileInterval.Duration < time.Second {
		bad("reconcile_interval", "%s must be at least 1s", c.ReconcileInterval)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("log_level", "%q is not one of debug, info, warn, error", c.LogLevel)
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		bad("log_format", "%q is not one of text, json", c.LogFormat)
	}
	switch c.Enforcement {
	case EnforcementEnforce, EnforcementAuditOnly:
	default:
		bad("enforcement", "%q is not one of enforce, audit-only", c.Enforcement)
	}
	switch c.AdoptUnconfirmed {
	case AdoptAuditOnly, AdoptDeny:
	default:
		bad("adopt_unconfirmed", "%q is not one of deny, audit-only", c.AdoptUnconfirmed)
	}
	if m := c.AdoptUnconfirmedMax.Duration; m < time.Second || m > 24*time.Hour {
		bad("adopt_unconfirmed_max", "%s must be between 1s and 24h", c.AdoptUnconfirmedMax)
	}
	if c.PinDir != "" && !filepath.IsAbs(c.PinDir) {
		bad("pin_dir", "%q must be an absolute path on bpffs (or empty)", c.PinDir)
	}
	if c.FailOpenSpool != "" && !filepath.IsAbs(c.FailOpenSpool) {
		bad("failopen_spool", "%q must be an absolute path (or empty)", c.FailOpenSpool)
	}
	if c.Slurmd != "" && !filepath.IsAbs(c.Slurmd) {
		bad("slurmd", "%q must be an absolute path (or empty: found beside Slurm's other commands)", c.Slurmd)
	}
	switch c.SlurmdGPUTable {
	case SlurmdGPUTableAuto, SlurmdGPUTableRequired, SlurmdGPUTableOff:
	default:
		bad("slurmd_gpu_table", "%q is not one of auto, required, off", c.SlurmdGPUTable)
	}
	switch c.NVML {
	case NVMLAuto, NVMLRequired, NVMLOff:
	default:
		bad("nvml", "%q is not one of auto, required, off", c.NVML)
	}
	if c.StateFile != "" && !filepath.IsAbs(c.StateFile) {
		bad("state_file", "%q must be an absolute path (or empty)", c.StateFile)
	}
	if c.Metrics.Listen != "" {
		if err := checkListen(c.Metrics.Listen); err != nil {
			bad("metrics.listen", "%q: %v (or empty to disable)", c.Metrics.Listen, err)
		}
	}
	if c.Metrics.WebConfig != "" && !filepath.IsAbs(c.Metrics.WebConfig) {
		bad("metrics.web_config", "%q must be an absolute path (or empty: node aggregates only)", c.Metrics.WebConfig)
	}
	if c.Metrics.MaxConnections < 1 || c.Metrics.MaxConnections > 4096 {
		bad("metrics.max_connections", "%d must be from 1 to 4096", c.Metrics.MaxConnections)
	}
	if c.Metrics.SampleInterval.Duration < time.Second || c.Metrics.SampleInterval.Duration > 10*time.Minute {
		bad("metrics.sample_interval", "%s must be between 1s and 10m", c.Metrics.SampleInterval)
	}
	if c.Metrics.IdleThreshold < 1 || c.Metrics.IdleThreshold > 100 {
		bad("metrics.idle_threshold", "%d must be a percentage from 1 to 100", c.Metrics.IdleThreshold)
	}
	if d := c.Metrics.IdleAuditAfter.Duration; d != 0 && d < c.Metrics.SampleInterval.Duration {
		bad("metrics.idle_audit_after", "%s must be 0 (off) or at least metrics.sample_interval (%s)", c.Metrics.IdleAuditAfter, c.Metrics.SampleInterval)
	}
	if c.DCGMJobMappingDir != "" && !filepath.IsAbs(c.DCGMJobMappingDir) {
		bad("dcgm_job_mapping_dir", "%q must be an absolute path (or empty)", c.DCGMJobMappingDir)
	}
	a := c.Audit
	if a.File != "" && !filepath.IsAbs(a.File) {
		bad("audit.file", "%q must be an absolute path (or empty to disable)", a.File)
	}
	if a.OCSFFile != "" && !filepath.IsAbs(a.OCSFFile) {
		bad("audit.ocsf_file", "%q must be an absolute path (or empty for none)", a.OCSFFile)
	} else if a.OCSFFile != "" && filepath.Clean(a.OCSFFile) == filepath.Clean(a.File) {
		bad("audit.ocsf_file", "%q is audit.file too: the OCSF events need a file of their own", a.OCSFFile)
	}
	switch a.Journald {
	case "auto", "on", "off":
	default:
		bad("audit.journald", "%q is not one of auto, on, off", a.Journald)
	}
	if a.Syslog != "" && !strings.HasPrefix(a.Syslog, "unix://") && !strings.HasPrefix(a.Syslog, "unixgram://") && !strings.HasPrefix(a.Syslog, "tcp://") && !strings.HasPrefix(a.Syslog, "tls://") {
		bad("audit.syslog", "%q is not unix:///path, unixgram:///path, tcp://host:port or tls://host:port", a.Syslog)
	}
	for _, f := range []struct{ key, v string }{{"audit.syslog_tls_ca", a.SyslogTLSCA}, {"audit.syslog_tls_cert", a.SyslogTLSCert}, {"audit.syslog_tls_key", a.SyslogTLSKey}, {"audit.syslog_tls_server_name", a.SyslogTLSServerName}} {
		if f.v != "" && !strings.HasPrefix(a.Syslog, "tls://") {
			bad(f.key, "is set but audit.syslog %q is not a tls:// target", a.Syslog)
		} else if f.v != "" && f.key != "audit.syslog_tls_server_name" && !filepath.IsAbs(f.v) {
			bad(f.key, "%q must be an absolute path", f.v)
		}
	}
	if (a.SyslogTLSCert == "") != (a.SyslogTLSKey == "") {
		bad("audit.syslog_tls_cert", "a client certificate needs both audit.syslog_tls_cert and audit.syslog_tls_key")
	}
	switch a.Allowed {
	case "none", "first", "all":
	default:
		bad("audit.allowed", "%q is not one of none, first, all", a.Allowed)
	}
	if a.RateWindow.Duration < time.Millisecond || a.RateWindow.Duration > time.Hour {
		bad("audit.rate_window", "%s must be between 1ms and 1h", a.RateWindow)
	}
	if a.RateBurst == 0 || a.RateBurst > 1000000 {
		bad("audit.rate_burst", "%d must be between 1 and 1000000", a.RateBurst)
	}
	if a.FlushInterval.Duration < 100*time.Millisecond {
		bad("audit.flush_interval", "%s must be at least 100ms", a.FlushInterval)
	}
	if a.QueueSize < 16 || a.QueueSize > 1<<20 {
		bad("audit.queue_size", "%d must be between 16 and 1048576", a.QueueSize)
	}
	if n, err := strconv.ParseUint(a.FileMode, 8, 32); err != nil {
		bad("audit.file_mode", "%q is not an octal mode such as 0640", a.FileMode)
	} else if err := audit.CheckFileMode(os.FileMode(n)); err != nil {
		bad("audit.file_mode", "%v", err)
	}
	if a.FileGroup != "" && strings.ContainsFunc(a.FileGroup, func(r rune) bool { return r <= ' ' || r == ':' || r == '/' || r == 0x7f }) {
		bad("audit.file_group", "%q is not a group name or number", a.FileGroup)
	}
	switch a.EC2InstanceID {
	case "auto", "on", "off":
	default:
		bad("audit.ec2_instance_id", "%q is not one of auto, on, off", a.EC2InstanceID)
	}
	if u, err := url.Parse(a.IMDSEndpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		bad("audit.imds_endpoint", "%q is not a base URL such as http://169.254.169.254", a.IMDSEndpoint)
	}
	return errors.Join(errs...)
}
