module github.com/gpufence/gpufence

go 1.26.0

require google.golang.org/protobuf v1.36.12

require (
	github.com/cilium/ebpf v0.22.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)

tool (
	github.com/cilium/ebpf/cmd/bpf2go
	google.golang.org/protobuf/cmd/protoc-gen-go
)
