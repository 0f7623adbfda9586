package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Set at build time with -ldflags "-X main.version=... -X main.commit=..."
// (the Dockerfile and the release workflow do).
var (
	version = "dev"
	commit  = ""
)

// build is what courier knows of its own build: the linker's stamp, else
// what the Go toolchain recorded in the binary (runtime/debug.ReadBuildInfo:
// the module version of `go install ...@v1.2.3`, the VCS revision of a
// build in a checkout, the target and build tags).
type build struct {
	version  string // "dev" when nothing says
	commit   string // "" when nothing says; "-dirty" appended for a modified checkout
	time     string // the commit's time (vcs.time), if known
	goVer    string
	platform string // GOOS/GOARCH
	tags     string // -tags, if any
}

// readBuild reads the build of this binary.
func readBuild() build {
	bi, _ := debug.ReadBuildInfo()
	return describeBuild(version, commit, runtime.Version(), bi)
}

// describeBuild fills in what the linker did not set (linkVersion "dev",
// linkCommit "") from bi, which may be nil.
func describeBuild(linkVersion, linkCommit, goVersion string, bi *debug.BuildInfo) build {
	b := build{version: linkVersion, commit: linkCommit, goVer: goVersion}
	if bi == nil {
		return b
	}
	// "(devel)" is what the toolchain records when it knows no version
	// (a build outside a checkout, or with -buildvcs=false).
	if (b.version == "" || b.version == "dev") && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		b.version = bi.Main.Version
	}
	if b.version == "" {
		b.version = "dev"
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if b.commit == "" && settings["vcs.revision"] != "" {
		b.commit = settings["vcs.revision"]
		if settings["vcs.modified"] == "true" {
			b.commit += "-dirty"
		}
		b.time = settings["vcs.time"]
	}
	if settings["GOOS"] != "" {
		b.platform = settings["GOOS"] + "/" + settings["GOARCH"]
	}
	b.tags = settings["-tags"]
	return b
}

// buildInfo returns version, commit ("unknown" when nothing says) and Go
// version: the labels of courier_build_info, and what tracing and the
// request/reply service report.
func buildInfo() (v, c, goVersion string) {
	b := readBuild()
	c = b.commit
	if c == "" {
		c = "unknown"
	}
	return b.version, c, b.goVer
}

// String is the line `courier version` prints: the version, then what is
// known of the build, such as
// "courier v1.2.0 (commit 3f2c…, 2026-11-30T09:12:00Z, go1.26.8, linux/amd64)".
func (b build) String() string {
	var parts []string
	if b.commit != "" {
		parts = append(parts, "commit "+b.commit)
	}
	if b.time != "" {
		parts = append(parts, b.time)
	}
	parts = append(parts, b.goVer)
	if b.platform != "" {
		parts = append(parts, b.platform)
	}
	if b.tags != "" {
		parts = append(parts, "tags "+b.tags)
	}
	return fmt.Sprintf("courier %s (%s)", b.version, strings.Join(parts, ", "))
}

func versionString() string { return readBuild().String() }
