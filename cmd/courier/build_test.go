package main

import (
	"bufio"
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestDockerfileBuild builds the binary with the Dockerfile's own `go build`
// line (no Docker engine needed), then checks that it is static, that the
// flags took effect, and that `courier version` prints what was stamped.
func TestDockerfileBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary: skipped with -short")
	}
	if runtime.GOOS != "linux" {
		t.Skip("the image is linux; the ELF checks need a linux binary")
	}
	const (
		testVersion = "v9.8.7-test"
		testCommit  = "0123456789abcdef0123456789abcdef01234567"
	)
	envs, args := dockerfileGoBuild(t, "../../Dockerfile", map[string]string{
		"VERSION": testVersion, "COMMIT": testCommit, "TARGETOS": runtime.GOOS, "TARGETARCH": runtime.GOARCH,
	})

	// The Dockerfile writes to /out; redirect -o into the test's directory.
	bin := filepath.Join(t.TempDir(), "courier")
	out := -1
	for i, a := range args {
		if a == "-o" && i+1 < len(args) {
			out = i + 1
		}
	}
	if out < 0 {
		t.Fatalf("Dockerfile's go build has no -o: %q", args)
	}
	args[out] = bin

	cmd := exec.Command("go", args...)
	cmd.Dir = "../.." // the Dockerfile builds from the module root (WORKDIR /src, COPY . .)
	cmd.Env = append(os.Environ(), envs...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, b)
	}

	t.Run("version", func(t *testing.T) {
		b, err := exec.Command(bin, "version").CombinedOutput()
		if err != nil {
			t.Fatalf("courier version: %v\n%s", err, b)
		}
		got := strings.TrimSpace(string(b))
		for _, want := range []string{testVersion, testCommit, "go1."} {
			if !strings.Contains(got, want) {
				t.Errorf("courier version = %q, want it to contain %q", got, want)
			}
		}
	})

	t.Run("static", func(t *testing.T) {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Error("binary has a PT_INTERP program header: it is dynamically linked, distroless/static cannot run it")
			}
		}
		libs, err := f.ImportedLibraries()
		if err != nil {
			t.Fatal(err)
		}
		if len(libs) > 0 {
			t.Errorf("binary needs shared libraries %q", libs)
		}
		if s := f.Section(".symtab"); s != nil {
			t.Error("binary has a symbol table: -s did not take effect")
		}
	})

	t.Run("flags", func(t *testing.T) {
		bi, err := buildinfo.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		settings := map[string]string{}
		for _, s := range bi.Settings {
			settings[s.Key] = s.Value
		}
		for k, want := range map[string]string{"CGO_ENABLED": "0", "-trimpath": "true", "-tags": "nodemo"} {
			if settings[k] != want {
				t.Errorf("build setting %s = %q, want %q", k, settings[k], want)
			}
		}
		// The image carries no embedded NATS server: that is the demo's.
		for _, d := range bi.Deps {
			if d.Path == "github.com/nats-io/nats-server/v2" {
				t.Errorf("the image's binary links %s", d.Path)
			}
		}
	})
}

// TestDockerfileToolchain: the image is built with go.mod's exact Go, and
// never downloads another (GOTOOLCHAIN=local), so what is tested is what
// ships.
func TestDockerfileToolchain(t *testing.T) {
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var goVersion string
	for _, line := range strings.Split(string(mod), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "go "); ok {
			goVersion = strings.TrimSpace(v)
		}
	}
	if goVersion == "" {
		t.Fatal("go.mod has no go directive")
	}
	df, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var from string
	local := false
	for _, line := range strings.Split(string(df), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "FROM" && from == "" {
			for _, w := range f[1:] {
				if strings.HasPrefix(w, "golang:") {
					from = w
				}
			}
		}
		if len(f) >= 2 && f[0] == "ENV" && strings.Join(f[1:], " ") == "GOTOOLCHAIN=local" {
			local = true
		}
	}
	if want := "golang:" + goVersion + "-"; !strings.HasPrefix(from, want) {
		t.Errorf("build stage FROM %q, want %s… (go.mod says go %s)", from, want, goVersion)
	}
	if !local {
		t.Error("the Dockerfile does not set ENV GOTOOLCHAIN=local: a go.mod ahead of the image would download a toolchain")
	}
}

// TestReleaseWorkflow: a version tag builds and pushes both architectures,
// stamping the tag and commit into the binary.
func TestReleaseWorkflow(t *testing.T) {
	b, err := os.ReadFile("../../.github/workflows/release.yml")
	if err != nil {
		t.Fatal(err)
	}
	var wf struct {
		On struct {
			Push struct {
				Tags []string `yaml:"tags"`
			} `yaml:"push"`
		} `yaml:"on"`
		Jobs map[string]struct {
			Needs any `yaml:"needs"`
			Steps []struct {
				Uses string            `yaml:"uses"`
				Run  string            `yaml:"run"`
				With map[string]string `yaml:"with"`
			} `yaml:"steps"`
		} `yaml:"jobs"`
	}
	if err := yaml.Unmarshal(b, &wf); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(wf.On.Push.Tags, "v*") {
		t.Errorf("release runs on tags %q, want v*", wf.On.Push.Tags)
	}
	tested, built := false, false
	for name, job := range wf.Jobs {
		for _, st := range job.Steps {
			tested = tested || strings.Contains(st.Run, ".ci/run")
			if !strings.HasPrefix(st.Uses, "docker/build-push-action@") {
				continue
			}
			built = true
			if job.Needs == nil {
				t.Errorf("job %s pushes an image without waiting for the tests", name)
			}
			w := st.With
			for _, want := range []string{"linux/amd64", "linux/arm64"} {
				if !strings.Contains(w["platforms"], want) {
					t.Errorf("platforms %q lack %s", w["platforms"], want)
				}
			}
			for _, want := range []string{"VERSION=${{ github.ref_name }}", "COMMIT=${{ github.sha }}"} {
				if !strings.Contains(w["build-args"], want) {
					t.Errorf("build-args %q lack %s", w["build-args"], want)
				}
			}
			if w["push"] != "true" {
				t.Errorf("push = %q", w["push"])
			}
		}
	}
	if !tested || !built {
		t.Errorf("release: runs the tests %v, builds with buildx %v", tested, built)
	}
	if !strings.Contains(string(b), "images: ghcr.io/courierhq/courier") || !strings.Contains(string(b), "value=latest") {
		t.Error("release does not tag ghcr.io/courierhq/courier with the version and latest")
	}
}

// dockerfileGoBuild finds the Dockerfile's RUN line that runs `go build` and
// returns its environment assignments and go's arguments, with ${NAME}
// expanded from args (an unknown name fails the test).
func dockerfileGoBuild(t *testing.T, path string, vars map[string]string) (env, args []string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var found []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		rest, ok := strings.CutPrefix(line, "RUN ")
		if !ok || !strings.Contains(rest, "go build") {
			continue
		}
		if strings.HasSuffix(rest, `\`) || strings.ContainsAny(rest, ";&|") {
			t.Fatalf("Dockerfile: keep the go build on one RUN line of its own: %q", line)
		}
		if found != nil {
			t.Fatalf("Dockerfile: more than one RUN line runs go build")
		}
		found, err = shellWords(rest, vars)
		if err != nil {
			t.Fatalf("Dockerfile: %q: %v", line, err)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if found == nil {
		t.Fatal("Dockerfile: no RUN line runs go build")
	}
	i := 0
	for ; i < len(found) && strings.Contains(found[i], "=") && !strings.HasPrefix(found[i], "-"); i++ {
		env = append(env, found[i])
	}
	if i+1 >= len(found) || found[i] != "go" || found[i+1] != "build" {
		t.Fatalf("Dockerfile: want `[NAME=value ...] go build ...`, got %q", found)
	}
	return env, found[i+1:]
}

// shellWords splits s as a POSIX shell would for the simple commands a
// Dockerfile RUN line holds: blanks separate words, double and single quotes
// group, and ${NAME} or $NAME expand from vars (not inside single quotes).
func shellWords(s string, vars map[string]string) ([]string, error) {
	var (
		words   []string
		cur     strings.Builder
		inWord  bool
		quote   rune
		missing []string
	)
	expand := func(v string) string {
		return os.Expand(v, func(name string) string {
			val, ok := vars[name]
			if !ok {
				missing = append(missing, name)
			}
			return val
		})
	}
	var seg strings.Builder // an unquoted or double-quoted run, expanded when it ends
	flush := func() {
		cur.WriteString(expand(seg.String()))
		seg.Reset()
	}
	for _, r := range s {
		switch {
		case quote == '\'':
			if r == '\'' {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case quote == '"':
			if r == '"' {
				flush()
				quote = 0
			} else {
				seg.WriteRune(r)
			}
		case r == '\'' || r == '"':
			flush()
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				flush()
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case r == '\\':
			return nil, fmt.Errorf("backslash escapes are not supported here")
		default:
			seg.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if inWord {
		flush()
		words = append(words, cur.String())
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("no value for %s", strings.Join(missing, ", "))
	}
	return words, nil
}
