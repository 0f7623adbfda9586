package main

import (
	"runtime/debug"
	"testing"
)

// Without the linker's stamp, `courier version` says what the toolchain
// recorded: the module version of `go install ...@version`, the revision of
// a build in a checkout, the target and tags; never "commit unknown".
func TestDescribeBuild(t *testing.T) {
	settings := func(kv ...string) []debug.BuildSetting {
		var out []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			out = append(out, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	for _, tc := range []struct {
		name                 string
		linkVersion, linkRev string
		bi                   *debug.BuildInfo
		want                 string
	}{
		{"no build info", "dev", "", nil, "courier dev (go1.26.8)"},
		{"go install at a version", "dev", "", &debug.BuildInfo{
			Main:     debug.Module{Version: "v1.4.0"},
			Settings: settings("GOOS", "linux", "GOARCH", "arm64", "CGO_ENABLED", "0"),
		}, "courier v1.4.0 (go1.26.8, linux/arm64)"},
		{"a checkout, modified", "dev", "", &debug.BuildInfo{
			Main: debug.Module{Version: "v1.4.1-0.20261130091200-3f2c1a0b9d8e+dirty"},
			Settings: settings("GOOS", "linux", "GOARCH", "amd64", "-tags", "nodemo",
				"vcs.revision", "3f2c1a0b9d8e", "vcs.time", "2026-11-30T09:12:00Z", "vcs.modified", "true"),
		}, "courier v1.4.1-0.20261130091200-3f2c1a0b9d8e+dirty (commit 3f2c1a0b9d8e-dirty, 2026-11-30T09:12:00Z, go1.26.8, linux/amd64, tags nodemo)"},
		{"-buildvcs=false", "dev", "", &debug.BuildInfo{
			Main:     debug.Module{Version: "(devel)"},
			Settings: settings("GOOS", "darwin", "GOARCH", "arm64"),
		}, "courier dev (go1.26.8, darwin/arm64)"},
		{"the linker's stamp wins", "1.2.0", "abc", &debug.BuildInfo{
			Main:     debug.Module{Version: "v9.9.9"},
			Settings: settings("GOOS", "linux", "GOARCH", "amd64", "vcs.revision", "def"),
		}, "courier 1.2.0 (commit abc, go1.26.8, linux/amd64)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := describeBuild(tc.linkVersion, tc.linkRev, "go1.26.8", tc.bi).String(); got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}
