package config

import (
	"errors"
	"io/fs"
	"net/url"
	"os"
	"strconv"
	"strings"
)

func (c *checker) checkNATS(cfg *Config) {
	c.checkNATSURL(cfg.NATSURL)

	if cfg.NATSCert != "" && cfg.NATSKey == "" {
		c.note("NATS_CERT", "NATS_CERT is set but NATS_KEY is not: a client certificate needs its private key")
	}
	if cfg.NATSKey != "" && cfg.NATSCert == "" {
		c.note("NATS_KEY", "NATS_KEY is set but NATS_CERT is not: a private key needs its client certificate")
	}
	if cfg.NATSUser != "" && cfg.NATSPassword == "" {
		c.note("NATS_USER", "NATS_USER is set but NATS_PASSWORD is not: user authentication needs both")
	}
	if cfg.NATSPassword != "" && cfg.NATSUser == "" {
		c.note("NATS_PASSWORD", "NATS_PASSWORD is set but NATS_USER is not: user authentication needs both")
	}

	var methods []string
	for _, m := range []struct{ name, value string }{
		{"NATS_CREDS", cfg.NATSCreds},
		{"NATS_NKEY", cfg.NATSNKey},
		{"NATS_USER", cfg.NATSUser},
		{"NATS_TOKEN", cfg.NATSToken},
	} {
		if m.value != "" {
			methods = append(methods, m.name)
		}
	}
	if len(methods) > 1 {
		c.note(methods[0], strings.Join(methods, ", ")+
			" are all set: choose one way to authenticate (NATS_CREDS, NATS_NKEY, NATS_USER with NATS_PASSWORD, or NATS_TOKEN)")
	}

	for _, f := range []struct{ name, path string }{
		{"NATS_CREDS", cfg.NATSCreds},
		{"NATS_NKEY", cfg.NATSNKey},
		{"NATS_CA", cfg.NATSCA},
		{"NATS_CERT", cfg.NATSCert},
		{"NATS_KEY", cfg.NATSKey},
	} {
		if f.path == "" {
			continue
		}
		if msg := readable(f.path); msg != "" {
			c.add(f.name, "%s", msg)
		}
	}
}

// checkNATSURL accepts what the NATS client does: a comma list of
// nats://, tls://, ws:// or wss:// URLs, the scheme optional.
func (c *checker) checkNATSURL(v string) {
	const name = "NATS_URL"
	entries := natsURLEntries(v)
	if len(entries) == 0 {
		c.add(name, "no server URL: expected nats://host:port, comma separated for several")
		return
	}
	var ws, plain, cut bool
	for _, e := range entries {
		which := "" // name the entry only when there are several
		if len(entries) > 1 {
			which = strconv.Quote(e.shown) + ": "
		}
		if e.cutSecret {
			// The client splits the list on every comma, and would dial
			// the pieces of this URL: say so once.
			if !cut {
				c.add(name, "a user or password holds a ',', which separates server URLs: percent-encode it as %%2C")
			}
			cut = true
			continue
		}
		s := e.raw
		if !strings.Contains(s, "://") {
			s = "nats://" + s // as the NATS client does
		}
		u, err := url.Parse(s)
		if err != nil {
			// url's error would quote the URL, password and all.
			c.add(name, "%snot a valid URL: expected nats://host:port (percent-encode special characters in a user or password)", which)
			continue
		}
		switch u.Scheme {
		case "nats", "tls":
			plain = true
		case "ws", "wss":
			ws = true
		default:
			c.add(name, "%sthe scheme must be nats, tls, ws or wss", which)
			continue
		}
		if u.Host == "" {
			c.add(name, "%sno host: expected nats://host:port", which)
		}
	}
	if ws && plain {
		c.add(name, "mixes websocket (ws, wss) and plain (nats, tls) URLs, which the NATS client refuses")
	}
}

// readable explains why the file at path cannot be read, or returns "".
func readable(path string) string {
	f, err := os.Open(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is already in the problem
		}
		return "cannot read the file: " + err.Error()
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "cannot read the file: " + err.Error()
	}
	if fi.IsDir() {
		return "is a directory, not a file"
	}
	return ""
}
