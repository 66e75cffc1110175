// SPDX-License-Identifier: Apache-2.0

package config

import "testing"

func TestAuditHostIdentityConfig(t *testing.T) {
	c, ok := loadYAML(t, "", nil)
	if ok && (c.Audit.EC2InstanceID != "auto" || c.Audit.IMDSEndpoint != "http://169.254.169.254") {
		t.Errorf("defaults: %+v", c.Audit)
	}
	c, ok = loadYAML(t, "audit:\n  ec2_instance_id: off\n  imds_endpoint: http://127.0.0.1:8111\n", nil)
	if ok && (c.Audit.EC2InstanceID != "off" || c.Audit.IMDSEndpoint != "http://127.0.0.1:8111") {
		t.Errorf("values: %+v", c.Audit)
	}
	for body, want := range map[string]string{
		"audit:\n  ec2_instance_id: maybe\n":                        `audit.ec2_instance_id: "maybe" is not one of auto, on, off`,
		"audit:\n  imds_endpoint: 169.254.169.254\n":                `audit.imds_endpoint: "169.254.169.254" is not a base URL`,
		"audit:\n  imds_endpoint: http://169.254.169.254/latest/\n": `audit.imds_endpoint`,
		"audit:\n  imds_endpoint: ftp://169.254.169.254\n":          `audit.imds_endpoint`,
	} {
		loadYAML(t, body, []string{want})
	}
}

func TestAuditFileModeAndGroup(t *testing.T) {
	c, ok := loadYAML(t, "", nil)
	if ok && (c.Audit.AuditFileMode() != 0o640 || c.Audit.FileGroup != "") {
		t.Errorf("defaults: mode %v group %q", c.Audit.AuditFileMode(), c.Audit.FileGroup)
	}
	// Written as YAML would: a quoted string or a bare number with a leading 0.
	for _, body := range []string{"audit:\n  file_mode: \"0600\"\n  file_group: adm\n", "audit:\n  file_mode: 0600\n  file_group: adm\n"} {
		c, ok = loadYAML(t, body, nil)
		if ok && (c.Audit.AuditFileMode() != 0o600 || c.Audit.FileGroup != "adm") {
			t.Errorf("%q: mode %v group %q", body, c.Audit.AuditFileMode(), c.Audit.FileGroup)
		}
	}
	for body, want := range map[string]string{
		"audit:\n  file_mode: rw-r-----\n": `audit.file_mode: "rw-r-----" is not an octal mode`,
		"audit:\n  file_mode: 0660\n":      "audit.file_mode: mode 0660: the audit file must be 0600 or 0640",
		"audit:\n  file_mode: 0644\n":      "audit.file_mode: mode 0644",
		"audit:\n  file_mode: 0750\n":      "audit.file_mode: mode 0750",
		"audit:\n  file_mode: 0440\n":      "audit.file_mode: mode 0440",
		"audit:\n  file_group: \"a b\"\n":  `audit.file_group: "a b" is not a group name`,
	} {
		loadYAML(t, body, []string{want})
	}
}

func TestAuditSyslogTLSConfig(t *testing.T) {
	c, ok := loadYAML(t, "audit:\n  syslog: tls://logs.example.org:6514\n  syslog_tls_ca: /etc/gpufence/ca.pem\n  syslog_tls_server_name: logs.example.org\n", nil)
	if ok && (c.Audit.Syslog != "tls://logs.example.org:6514" || c.Audit.SyslogTLSCA != "/etc/gpufence/ca.pem") {
		t.Errorf("values: %+v", c.Audit)
	}
	for body, want := range map[string]string{
		"audit:\n  syslog: tcp://logs:514\n  syslog_tls_ca: /etc/ca.pem\n":   `audit.syslog_tls_ca: is set but audit.syslog "tcp://logs:514" is not a tls:// target`,
		"audit:\n  syslog: tls://logs:6514\n  syslog_tls_ca: ca.pem\n":       `audit.syslog_tls_ca: "ca.pem" must be an absolute path`,
		"audit:\n  syslog: tls://logs:6514\n  syslog_tls_cert: /etc/c.pem\n": "needs both audit.syslog_tls_cert and audit.syslog_tls_key",
		"audit:\n  syslog: udp://logs:514\n":                                 "tls://host:port",
	} {
		loadYAML(t, body, []string{want})
	}
}

func TestAuditOCSFFileConfig(t *testing.T) {
	c, ok := loadYAML(t, "", nil)
	if ok && c.Audit.OCSFFile != "" {
		t.Errorf("default ocsf_file %q, want none", c.Audit.OCSFFile)
	}
	c, ok = loadYAML(t, "audit:\n  ocsf_file: /var/log/gpufence/audit.ocsf.jsonl\n", nil)
	if ok && c.Audit.OCSFFile != "/var/log/gpufence/audit.ocsf.jsonl" {
		t.Errorf("ocsf_file %q", c.Audit.OCSFFile)
	}
	for body, want := range map[string]string{
		"audit:\n  ocsf_file: audit.ocsf.jsonl\n":                   `audit.ocsf_file: "audit.ocsf.jsonl" must be an absolute path`,
		"audit:\n  ocsf_file: /var/log/gpufence/audit.jsonl\n":      `audit.ocsf_file: "/var/log/gpufence/audit.jsonl" is audit.file too`,
		"audit:\n  ocsf_file: /var/log/gpufence/./audit.jsonl\n":    `is audit.file too`,
		"audit:\n  file: /tmp/a.jsonl\n  ocsf_file: /tmp/a.jsonl\n": `is audit.file too`,
	} {
		loadYAML(t, body, []string{want})
	}
}
