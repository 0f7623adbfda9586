//go:build benchprof

package main

// A CPU profile of courier as the benchmark runs it, in the bench build only
// (go build -tags nodemo,benchprof; never in the image): with
// BENCH_CPUPROFILE=prefix set, courier writes a profile of every 5 seconds
// it runs to prefix.<pid>.<n>, and a heap profile at the end of each to
// prefix.heap.<pid>.<n>, so no shutdown hook is needed and a drain's CPU
// profiles merge with `go tool pprof -top courier prefix.<pid>.*`. The
// variable is not a COURIER_ one: the config would warn about an unknown
// name.

import (
	"fmt"
	"os"
	"runtime/pprof"
	"time"
)

func init() {
	prefix := os.Getenv("BENCH_CPUPROFILE")
	if prefix == "" {
		return
	}
	go func() {
		for n := 0; ; n++ {
			f, err := os.Create(fmt.Sprintf("%s.%d.%d", prefix, os.Getpid(), n))
			if err != nil {
				return
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				_ = f.Close()
				return
			}
			time.Sleep(5 * time.Second)
			pprof.StopCPUProfile()
			_ = f.Close()
			if h, err := os.Create(fmt.Sprintf("%s.heap.%d.%d", prefix, os.Getpid(), n)); err == nil {
				_ = pprof.Lookup("heap").WriteTo(h, 0)
				_ = h.Close()
			}
		}
	}()
}
