// SPDX-License-Identifier: Apache-2.0

//go:build !cgo

// Command gpucheck needs cgo (NVML and CUDA are loaded with dlopen).
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Println("FAIL: gpucheck was built without cgo; build it with CGO_ENABLED=1")
	os.Exit(1)
}
