package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/courierhq/courier/config"
)

// loadConfig parses the environment; problems are printed one per line,
// with the warnings `courier config` prints (a misspelt variable is often
// why a required one is missing), and mean exit status 2.
func loadConfig(environ []string) (config.Config, error) {
	m := config.Environ(environ)
	cfg, err := config.Load(m)
	if err != nil {
		return cfg, invalidConfig(err, config.Warnings(cfg, m))
	}
	return cfg, nil
}

// loadConfigWithoutApp is loadConfig for the commands that talk to the
// server only (cleanup): COURIER_APP_URL, which config requires to consume,
// is filled with a placeholder when unset.
func loadConfigWithoutApp(environ []string) (config.Config, error) {
	m := config.Environ(environ)
	if m["COURIER_APP_URL"] == "" && m["COURIER_STREAM"] != "" {
		m["COURIER_APP_URL"] = "http://courier-no-app.invalid/"
	}
	cfg, err := config.Load(m)
	if err != nil {
		return cfg, invalidConfig(err, config.Warnings(cfg, m))
	}
	return cfg, nil
}

// invalidConfig is the exit-2 error listing every problem of err, then the
// warnings.
func invalidConfig(err error, warnings []config.Warning) error {
	for _, w := range warnings {
		err = fmt.Errorf("%w\nwarning: %s", err, w.Text)
	}
	return &exitError{code: 2, err: fmt.Errorf("invalid configuration:\n%w", indent(err))}
}

func indent(err error) error {
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		lines[i] = "  " + l
	}
	return errors.New(strings.Join(lines, "\n"))
}

// runConfig prints every variable (an invalid one as given) on stdout, the
// warnings on stderr, and fails with status 2 if the configuration is
// invalid.
func runConfig(environ []string, stdout, stderr io.Writer) error {
	vars, warnings, err := config.Inspect(config.Environ(environ))
	if werr := config.WriteTable(stdout, vars); werr != nil {
		return werr
	}
	for _, w := range warnings {
		fmt.Fprintf(stderr, "courier: warning: %s\n", w.Text)
	}
	if err != nil {
		return invalidConfig(err, nil) // the warnings are above
	}
	// The secrets and token files are read as the sidecar would read them.
	cfg, _ := config.Load(config.Environ(environ))
	auth, err := openAppAuth(cfg, nil)
	if err != nil {
		return err
	}
	auth.Close()
	return nil
}
