package config

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// TestStandardsVariables: COURIER_CLOUDEVENTS is binary (any case) or
// unset, anything else one problem; the secrets and token files must be
// readable files; `courier config` shows their paths and never what they
// hold.
func TestStandardsVariables(t *testing.T) {
	secrets, token := tempFile(t, "secrets"), tempFile(t, "token")
	cfg := mustLoad(t, with(map[string]string{
		"COURIER_CLOUDEVENTS":          " Binary ",
		"COURIER_SIGNING_SECRETS_FILE": secrets,
		"COURIER_APP_TOKEN_FILE":       token,
	}))
	if cfg.CloudEvents != CloudEventsBinary || cfg.SigningSecretsFile != secrets || cfg.AppTokenFile != token {
		t.Errorf("CloudEvents %q, SigningSecretsFile %q, AppTokenFile %q", cfg.CloudEvents, cfg.SigningSecretsFile, cfg.AppTokenFile)
	}
	if cfg := mustLoad(t, minimal()); cfg.CloudEvents != "" || cfg.SigningSecretsFile != "" || cfg.AppTokenFile != "" {
		t.Errorf("unset: %q %q %q, want all empty", cfg.CloudEvents, cfg.SigningSecretsFile, cfg.AppTokenFile)
	}

	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	for _, tt := range []struct {
		name    string
		environ map[string]string
		want    string
	}{
		{"structured", with(map[string]string{"COURIER_CLOUDEVENTS": "structured"}), `COURIER_CLOUDEVENTS="structured": expected binary`},
		{"secrets missing", with(map[string]string{"COURIER_SIGNING_SECRETS_FILE": missing}), `COURIER_SIGNING_SECRETS_FILE="` + missing + `": cannot read the file: no such file or directory`},
		{"token a directory", with(map[string]string{"COURIER_APP_TOKEN_FILE": dir}), `COURIER_APP_TOKEN_FILE="` + dir + `": is a directory, not a file`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := problems(t, tt.environ)
			if len(got) != 1 || !strings.HasPrefix(got[0], tt.want) {
				t.Errorf("problems:\n%s\nwant one starting\n %s", strings.Join(got, "\n"), tt.want)
			}
		})
	}

	vars, _, err := Inspect(with(map[string]string{"COURIER_SIGNING_SECRETS_FILE": secrets, "COURIER_APP_TOKEN_FILE": token}))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := WriteTable(&out, vars); err != nil {
		t.Fatal(err)
	}
	shown := map[string]string{}
	for line := range strings.Lines(out.String()) {
		if f := strings.Fields(line); len(f) > 1 {
			shown[f[0]] = f[1]
		}
	}
	for name, want := range map[string]string{"COURIER_CLOUDEVENTS": "-", "COURIER_SIGNING_SECRETS_FILE": secrets, "COURIER_APP_TOKEN_FILE": token} {
		if shown[name] != want {
			t.Errorf("courier config shows %s as %q, want %q:\n%s", name, shown[name], want, out.String())
		}
	}
}
