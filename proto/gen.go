// SPDX-License-Identifier: Apache-2.0

// Package proto holds the plugin-agent protocol definition; the generated Go
// code lives in gpufence/v1.
package proto

//go:generate sh -c "protoc --plugin=protoc-gen-go=$(go tool -n protoc-gen-go) --go_out=. --go_opt=paths=source_relative gpufence/v1/agent.proto"
