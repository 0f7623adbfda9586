//go:build benchprof

package main

// A CPU profile of courier as the benchmark runs it, in the bench build only
// (go build -tags nodemo,benchprof; never in the image): with
// BENCH_CPUPROFILE=prefix set, courier writes a profile of every 5 seconds
// it runs to prefix.<pid>.<n>, and at the end of each a heap profile to
// prefix.heap.<pid>.<n> and the GC's counts so far (cycles, live heap and
// goal, bytes and objects allocated) to prefix.gc.<pid>.<n>, so no shutdown
// hook is needed and a drain's CPU
// profiles merge with `go tool pprof -top courier prefix.<pid>.*`. The
// variable is not a COURIER_ one: the config would warn about an unknown
// name.

import (
	"fmt"
	"os"
	"runtime"
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
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			_ = os.WriteFile(fmt.Sprintf("%s.gc.%d.%d", prefix, os.Getpid(), n), fmt.Appendf(nil,
				"gc cycles %d, heap live after last gc %d KiB, goal %d KiB, allocated %d MiB in %d objects, gc cpu %.1f%%\n",
				ms.NumGC, ms.HeapAlloc>>10, ms.NextGC>>10, ms.TotalAlloc>>20, ms.Mallocs, 100*ms.GCCPUFraction), 0o644)
			if h, err := os.Create(fmt.Sprintf("%s.heap.%d.%d", prefix, os.Getpid(), n)); err == nil {
				_ = pprof.Lookup("heap").WriteTo(h, 0)
				_ = h.Close()
			}
		}
	}()
}
