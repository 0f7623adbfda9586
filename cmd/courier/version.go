package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set at build time with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = ""
)

// buildInfo returns version, commit and Go version, filling the commit from
// the module's VCS stamp when the linker did not set it.
func buildInfo() (v, c, goVersion string) {
	v, c = version, commit
	if bi, ok := debug.ReadBuildInfo(); ok && c == "" {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				c = s.Value
			}
		}
	}
	if c == "" {
		c = "unknown"
	}
	return v, c, runtime.Version()
}

func versionString() string {
	v, c, g := buildInfo()
	return fmt.Sprintf("courier %s (commit %s, %s)", v, c, g)
}
