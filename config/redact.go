package config

import (
	"net/url"
	"strings"
)

// redacted stands in for a secret wherever a value is shown.
const redacted = "[redacted]"

// redactVar redacts the raw value of the variable name for a message.
func redactVar(name, v string) string {
	switch name {
	case "NATS_PASSWORD", "NATS_TOKEN", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS":
		return redactSecret(v)
	case "NATS_URL":
		return redactNATSURLs(v)
	case "COURIER_APP_URL", "COURIER_APP_HEALTH_URL", "COURIER_REPLY_URL",
		"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":
		return redactHTTPURL(v)
	}
	return v
}

func redactSecret(v string) string {
	if v == "" {
		return ""
	}
	return redacted
}

// span is a secret part of a string, [start, end) in bytes.
type span struct{ start, end int }

// natsSecrets finds the secrets of NATS_URL, a comma list of server URLs:
// the password of each userinfo, or the whole userinfo when it has no ':'
// (a token to the NATS client). It works on the text, before the list is
// split on commas, so that nothing leaks from a password holding an
// unencoded ',' (or '/', '#', '@', which stop a URL from parsing): a
// userinfo runs back from an '@' to the "://" before it, or to the start of
// the list. Where that cannot be told from a server URL without
// credentials followed by one without a scheme, more is hidden, never less.
func natsSecrets(v string) []span {
	type info struct{ start, end int }
	var infos []info
	for a := 0; a < len(v); a++ {
		if v[a] != '@' {
			continue
		}
		start := 0
		if i := strings.LastIndex(v[:a], "://"); i >= 0 {
			start = i + len("://")
		}
		if n := len(infos); n > 0 && infos[n-1].end >= start {
			prev := infos[n-1].end // the previous '@', in this URL's authority
			if comma := strings.IndexByte(v[prev:a], ','); comma >= 0 {
				// The previous URL's host, then a URL without a scheme.
				start = prev + comma + 1
			} else {
				// An unencoded '@' in the userinfo: it runs on to this one.
				infos[n-1].end = a
				continue
			}
		}
		for start < a && v[start] == ' ' {
			start++
		}
		infos = append(infos, info{start, a})
	}
	spans := make([]span, 0, len(infos))
	for _, in := range infos {
		if c := strings.IndexByte(v[in.start:in.end], ':'); c >= 0 {
			spans = append(spans, span{in.start + c + 1, in.end})
		} else {
			spans = append(spans, span(in))
		}
	}
	return spans
}

// mask returns v[lo:hi] with every secret of spans in it replaced by
// "[redacted]", a secret cut by lo or hi included.
func mask(v string, spans []span, lo, hi int) string {
	var b strings.Builder
	at := lo
	for _, s := range spans {
		inside := s.start < hi && s.end > lo
		if s.start == s.end { // an empty password
			inside = lo <= s.start && s.start <= hi
		}
		if !inside {
			continue
		}
		start, end := max(s.start, lo), min(s.end, hi)
		b.WriteString(v[at:start])
		b.WriteString(redacted)
		at = end
	}
	b.WriteString(v[at:hi])
	return b.String()
}

// redactNATSURLs redacts the secrets of a NATS_URL list, keeping the rest
// as it is.
func redactNATSURLs(v string) string {
	return mask(v, natsSecrets(v), 0, len(v))
}

// natsURLEntry is one server URL of NATS_URL as the NATS client splits the
// list (on every comma), with its secrets redacted for messages.
type natsURLEntry struct {
	raw, shown string
	// cutSecret is true when a comma the client splits on lies inside a
	// password or token: the entry is a piece of a URL.
	cutSecret bool
}

// natsURLEntries splits NATS_URL as the NATS client does, trimming entries
// and dropping empty ones, and redacts each.
func natsURLEntries(v string) []natsURLEntry {
	spans := natsSecrets(v)
	var out []natsURLEntry
	lo := 0
	for lo <= len(v) {
		hi := len(v)
		if i := strings.IndexByte(v[lo:], ','); i >= 0 {
			hi = lo + i
		}
		start, end := lo, hi
		for start < end && v[start] == ' ' {
			start++
		}
		for end > start && v[end-1] == ' ' {
			end--
		}
		if start < end {
			e := natsURLEntry{raw: v[start:end], shown: mask(v, spans, start, end)}
			for _, s := range spans {
				cut := (lo > s.start && lo <= s.end) || (hi >= s.start && hi < s.end)
				if cut && strings.Contains(v[s.start:s.end], ",") {
					e.cutSecret = true
				}
			}
			out = append(out, e)
		}
		lo = hi + 1
	}
	return out
}

// redactHTTPURL redacts the password in the userinfo of an http(s) URL.
// An '@' in its path or query is left alone.
func redactHTTPURL(raw string) string {
	if !strings.Contains(raw, "@") {
		return raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return redactUserinfoText(raw) // cannot tell where userinfo ends: hide all of it
	}
	if u.User == nil {
		return raw
	}
	start := strings.Index(raw, "//") + len("//") // a URL with userinfo has an authority
	end := len(raw)
	if i := strings.IndexAny(raw[start:], "/?#"); i >= 0 {
		end = start + i
	}
	at := start + strings.LastIndex(raw[start:end], "@")
	userinfo := raw[start:at]
	if user, _, ok := strings.Cut(userinfo, ":"); ok {
		userinfo = user + ":" + redacted
	}
	return raw[:start] + userinfo + raw[at:]
}

// redactUserinfoText hides everything between the scheme and the last '@'
// of a URL that does not parse, but a user name followed by ':'.
func redactUserinfoText(raw string) string {
	at := strings.LastIndex(raw, "@")
	start := 0
	if i := strings.Index(raw[:at], "://"); i >= 0 {
		start = i + len("://")
	}
	if user, _, ok := strings.Cut(raw[start:at], ":"); ok {
		return raw[:start] + user + ":" + redacted + raw[at:]
	}
	return raw[:start] + redacted + raw[at:]
}
