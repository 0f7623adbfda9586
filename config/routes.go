package config

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"unicode"

	"github.com/courierhq/courier/internal/subject"
)

// Route sends the messages whose subject matches Pattern to Path on the
// app URL's origin (COURIER_ROUTES).
type Route struct {
	// Pattern is a NATS subject pattern: '*' stands for one token, '>' as
	// the last token for one or more (internal/subject's rules).
	Pattern string
	// Path is the request's path, starting with '/', and optionally its
	// query, as it is sent (percent-encoded): such as /orders or
	// /events?kind=created.
	Path string
}

// Routes are the routes of COURIER_ROUTES, in the order given: the first
// whose pattern matches a subject wins. The zero value routes nothing. It
// is immutable once parsed, so safe for concurrent use.
type Routes []Route

// routesSyntax is appended to every parse error: what COURIER_ROUTES looks
// like.
const routesSyntax = "expected PATTERN=PATH pairs, comma separated, such as orders.*.created=/created,orders.>=/orders"

// ParseRoutes parses COURIER_ROUTES: PATTERN=PATH pairs, comma separated,
// split at the first '=' (so a pattern cannot hold one; a path's query
// can). Spaces around items are ignored, and so are empty items. A pattern
// is a valid NATS subject pattern; a path starts with '/' (but not "//",
// which would name a host), holds no space, control character or '#', and
// a ',' in it must be percent-encoded (%2C) as it separates pairs. A route
// that an earlier one always wins over (orders.*.created after orders.>)
// is an error too: it would never be used. An error names every bad item.
func ParseRoutes(s string) (Routes, error) {
	var (
		routes Routes
		bad    []string
	)
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		r, err := parseRoute(item)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		if earlier, ok := shadowed(routes, r.Pattern); ok {
			bad = append(bad, fmt.Sprintf("%q is never used: %q before it matches every subject it matches, and the first match wins", item, earlier))
			continue
		}
		routes = append(routes, r)
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("%s (%s)", strings.Join(bad, "; "), routesSyntax)
	}
	return routes, nil
}

func parseRoute(item string) (Route, error) {
	pattern, path, ok := strings.Cut(item, "=")
	if !ok {
		return Route{}, fmt.Errorf("%q has no '='", item)
	}
	pattern, path = strings.TrimSpace(pattern), strings.TrimSpace(path)
	var serr *subject.Error
	if errors.As(subject.Check(pattern), &serr) {
		return Route{}, fmt.Errorf("%q: the pattern %q %s", item, pattern, serr.Why)
	}
	if why := checkRoutePath(path); why != "" {
		return Route{}, fmt.Errorf("%q: the path %q %s", item, path, why)
	}
	return Route{Pattern: pattern, Path: path}, nil
}

// checkRoutePath explains why p is not a path (and query) to send a request
// to, or returns "".
func checkRoutePath(p string) string {
	switch {
	case !strings.HasPrefix(p, "/"):
		return "must start with '/'"
	case strings.HasPrefix(p, "//"):
		return "must not start with \"//\", which names a host in a URL"
	case strings.ContainsFunc(p, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) || r > unicode.MaxASCII }):
		return "holds a space, a control character or a character beyond ASCII: percent-encode it"
	case strings.Contains(p, "#"):
		return "holds a '#': a fragment is never sent (percent-encode it as %23 if it is part of the path)"
	}
	if _, err := url.ParseRequestURI(p); err != nil {
		return "is not a valid URL path: a '%' must start an escape such as %2C"
	}
	return ""
}

// shadowed returns the pattern of an earlier route that matches every
// subject pattern matches.
func shadowed(earlier Routes, pattern string) (string, bool) {
	for _, r := range earlier {
		if covers(r.Pattern, pattern) {
			return r.Pattern, true
		}
	}
	return "", false
}

// covers reports whether every subject that valid pattern b matches, valid
// pattern a matches too.
func covers(a, b string) bool {
	at, bt := strings.Split(a, "."), strings.Split(b, ".")
	for i, x := range at {
		switch {
		case x == ">":
			return i < len(bt) // b has at least one token left
		case i >= len(bt):
			return false
		case bt[i] == ">":
			return false // b matches any number of tokens here, a a fixed one
		case x == "*":
		case x != bt[i]:
			return false // another literal, or '*' in b against a literal
		}
	}
	return len(at) == len(bt)
}

// Match returns the path of the first route whose pattern matches subject;
// false when none does (the message goes to COURIER_APP_URL).
func (rs Routes) Match(subj string) (path string, ok bool) {
	for _, r := range rs {
		if subject.Matches(r.Pattern, subj) {
			return r.Path, true
		}
	}
	return "", false
}

// String returns the routes as COURIER_ROUTES reads them back; "" for none.
func (rs Routes) String() string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.Pattern + "=" + r.Path
	}
	return strings.Join(parts, ",")
}

// RouteURL returns the URL a message routed to path (a Route's Path) is
// POSTed to, in COURIER_APP_URL's form, so that internal/appurl reads it:
// the app URL's scheme, user and host, or its Unix socket, with path (and
// its query) in place of the app URL's path and query. It returns "" when
// AppURL does not parse (Load has said why).
func (c Config) RouteURL(path string) string {
	if rest, ok := strings.CutPrefix(c.AppURL, "unix://"); ok {
		socket, _, _ := strings.Cut(rest, ":")
		return "unix://" + socket + ":" + path
	}
	u, err := url.Parse(c.AppURL)
	if err != nil {
		return ""
	}
	p, err := url.ParseRequestURI(path)
	if err != nil {
		return ""
	}
	u.Path, u.RawPath, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = p.Path, p.RawPath, p.RawQuery, p.ForceQuery, "", ""
	return u.String()
}

// checkRoutes checks that routes have messages to route: a courier that
// only serves COURIER_REPLY_SUBJECTS has none (requests go to
// COURIER_REPLY_URL).
func (c *checker) checkRoutes(cfg *Config) {
	if len(cfg.Routes) > 0 && cfg.Stream == "" && c.scope != scopeSubscription {
		c.add("COURIER_ROUTES", "is set but COURIER_STREAM is not: routes are for consumed messages; requests go to COURIER_REPLY_URL")
	}
}
