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
