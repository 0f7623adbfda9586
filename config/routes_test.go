package config

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestParseRoutes(t *testing.T) {
	for _, tt := range []struct {
		given string
		want  Routes
	}{
		{"orders.*.created=/created,orders.>=/orders", Routes{{"orders.*.created", "/created"}, {"orders.>", "/orders"}}},
		{" orders.created = /created , ,", Routes{{"orders.created", "/created"}}},
		{"a.b=/events?kind=b&v=2", Routes{{"a.b", "/events?kind=b&v=2"}}},
		{"a=/x%2Cy", Routes{{"a", "/x%2Cy"}}},
		{"*=/any,>=/rest", Routes{{"*", "/any"}, {">", "/rest"}}},
		// Neither covers the other: both can be taken.
		{"orders.*.created=/c,orders.eu.*=/eu", Routes{{"orders.*.created", "/c"}, {"orders.eu.*", "/eu"}}},
		{"", nil},
	} {
		got, err := ParseRoutes(tt.given)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("ParseRoutes(%q) = %v, %v; want %v", tt.given, got, err, tt.want)
		}
		if err == nil && tt.want != nil {
			back, err := ParseRoutes(got.String())
			if err != nil || !slices.Equal(back, got) {
				t.Errorf("ParseRoutes(%q.String()) = %v, %v", tt.given, back, err)
			}
		}
	}
}

// TestRoutesBadValues: every bad pair is named, in one problem of
// COURIER_ROUTES that says what is expected.
func TestRoutesBadValues(t *testing.T) {
	for _, tt := range []struct{ given, want string }{
		{"orders.created", `"orders.created" has no '='`},
		{"orders..x=/x", `"orders..x=/x": the pattern "orders..x" is not a valid subject: it has an empty token`},
		{"orders.>.x=/x", `"orders.>.x=/x": the pattern "orders.>.x" is not a valid subject: '>' can only be the last token`},
		{"orders*=/x", `"orders*=/x": the pattern "orders*" is not a valid subject: '*' and '>' are wildcards only as whole tokens`},
		{"=/x", `"=/x": the pattern "" is empty`},
		{"a=x", `"a=x": the path "x" must start with '/'`},
		{"a=", `"a=": the path "" must start with '/'`},
		{"a=//evil.example/x", `"a=//evil.example/x": the path "//evil.example/x" must not start with "//"`},
		{"a=/x y", `"a=/x y": the path "/x y" holds a space`},
		{"a=/x\x01", `the path "/x\x01" holds a space, a control character`},
		{"a=/é", `"a=/é": the path "/é" holds a space, a control character or a character beyond ASCII`},
		{"a=/x#top", `"a=/x#top": the path "/x#top" holds a '#'`},
		{"a=/x%zz", `"a=/x%zz": the path "/x%zz" is not a valid URL path`},
		{"orders.>=/all,orders.*.created=/created", `"orders.*.created=/created" is never used: "orders.>" before it matches every subject it matches`},
		{"a.b=/1,a.b=/2", `"a.b=/2" is never used: "a.b" before it`},
	} {
		got := problems(t, with(map[string]string{"COURIER_ROUTES": tt.given}))
		prefix := "COURIER_ROUTES=" + strconv.Quote(tt.given) + ": "
		if len(got) != 1 || !strings.HasPrefix(got[0], prefix) || !strings.Contains(got[0], tt.want) || !strings.HasSuffix(got[0], "("+routesSyntax+")") {
			t.Errorf("COURIER_ROUTES=%q: problems\n%s\nwant one starting %s, holding\n %s", tt.given, strings.Join(got, "\n"), prefix, tt.want)
		}
	}

	// Every bad pair at once.
	got := problems(t, with(map[string]string{"COURIER_ROUTES": "a=x,b.=/y,c=/z"}))
	if len(got) != 1 || !strings.Contains(got[0], `"a=x"`) || !strings.Contains(got[0], `"b.=/y"`) || strings.Contains(got[0], `"c=/z"`) {
		t.Errorf("problems:\n%s", strings.Join(got, "\n"))
	}

	// A courier that only serves requests has no message to route.
	got = problems(t, with(map[string]string{"COURIER_STREAM": "<unset>", "COURIER_REPLY_SUBJECTS": "q", "COURIER_ROUTES": "a=/a"}))
	if len(got) != 1 || !strings.HasPrefix(got[0], `COURIER_ROUTES="a=/a": is set but COURIER_STREAM is not`) {
		t.Errorf("problems:\n%s", strings.Join(got, "\n"))
	}
}

func TestRoutesMatch(t *testing.T) {
	routes := mustLoad(t, with(map[string]string{"COURIER_ROUTES": "orders.*.created=/created,orders.eu.>=/eu?region=eu,orders.>=/orders"})).Routes
	for _, tt := range []struct {
		subject, path string
		ok            bool
	}{
		{"orders.1.created", "/created", true},
		{"orders.eu.created", "/created", true}, // the first match wins
		{"orders.eu.1.paid", "/eu?region=eu", true},
		{"orders.1.paid", "/orders", true},
		{"orders.1.created.late", "/orders", true},
		{"orders", "", false},
		{"payments.1.created", "", false},
		{"Orders.1.created", "", false}, // subjects are case-sensitive
	} {
		path, ok := routes.Match(tt.subject)
		if path != tt.path || ok != tt.ok {
			t.Errorf("Match(%q) = %q, %v; want %q, %v", tt.subject, path, ok, tt.path, tt.ok)
		}
	}
	if path, ok := Routes(nil).Match("orders.1"); ok || path != "" {
		t.Errorf("no routes: Match = %q, %v", path, ok)
	}
	if got := describeValue(t, mustLoad(t, with(map[string]string{"COURIER_ROUTES": " a=/a , b.*=/b "})), "COURIER_ROUTES"); got != "a=/a,b.*=/b" {
		t.Errorf("courier config shows COURIER_ROUTES as %q", got)
	}
}

func TestCovers(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		want bool
	}{
		{"a.b", "a.b", true},
		{"a.*", "a.b", true},
		{"a.>", "a.b.c", true},
		{"a.>", "a.*", true},
		{"a.>", "a.>", true},
		{">", "a", true},
		{"*", "*", true},
		{"a.*", "a.>", false},
		{"a.b", "a.*", false},
		{"a.>", "a", false},
		{"a.*", "a.b.c", false},
		{"a.b.c", "a.b", false},
		{"a.*.c", "a.b.d", false},
		{"a.*.c", "*.b.c", false},
	} {
		if got := covers(tt.a, tt.b); got != tt.want {
			t.Errorf("covers(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}

// TestRouteURL: a route's path takes the place of the app URL's path and
// query, on its origin or its Unix socket.
func TestRouteURL(t *testing.T) {
	for _, tt := range []struct{ app, path, want string }{
		{"http://127.0.0.1:8080/messages", "/created", "http://127.0.0.1:8080/created"},
		{"https://u:pw@app.internal/hook?v=1", "/orders?kind=paid", "https://u:pw@app.internal/orders?kind=paid"},
		{"http://app/hook?v=1#f", "/x%2Cy", "http://app/x%2Cy"},
		{"unix:///run/app/app.sock", "/created", "unix:///run/app/app.sock:/created"},
		{"unix:///run/app/app.sock:/messages?v=2", "/orders?x=1", "unix:///run/app/app.sock:/orders?x=1"},
	} {
		cfg := Config{AppURL: tt.app}
		if got := cfg.RouteURL(tt.path); got != tt.want {
			t.Errorf("RouteURL(%q) of %q = %q, want %q", tt.path, tt.app, got, tt.want)
		}
		// What the HTTP client reads is a valid app URL.
		mustLoad(t, with(map[string]string{"COURIER_APP_URL": cfg.RouteURL(tt.path)}))
	}
}
