package config

// checkStandards checks COURIER_CLOUDEVENTS and that the signing secrets
// and token files can be read; their content is the sidecar's to check
// (appauth), as it reads them.
func (c *checker) checkStandards(cfg *Config) {
	switch cfg.CloudEvents {
	case "", CloudEventsBinary:
	default:
		c.add("COURIER_CLOUDEVENTS", "expected binary (CloudEvents attributes as ce-* headers), or unset for none")
	}
	for _, f := range []struct{ name, path string }{
		{"COURIER_SIGNING_SECRETS_FILE", cfg.SigningSecretsFile},
		{"COURIER_APP_TOKEN_FILE", cfg.AppTokenFile},
	} {
		if f.path == "" {
			continue
		}
		if msg := readable(f.path); msg != "" {
			c.add(f.name, "%s", msg)
		}
	}
}
