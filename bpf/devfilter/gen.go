// SPDX-License-Identifier: Apache-2.0

package devfilter

//go:generate go tool bpf2go -tags linux -target bpfel -type filter_config -type policy -type event -type decision -type audit_allowed -type rate_key -type rate_value -type bpf_cgroup_storage_key devfilter devfilter.bpf.c -- -I../headers -mcpu=v3 -Wall -Werror
