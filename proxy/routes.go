package proxy

import "github.com/courierhq/courier/apphttp"

// Routes (Options.Routes, COURIER_ROUTES): a message goes to the URL of the
// first route whose subject pattern its subject matches (the subject it
// was published on, with partitions too: sourced.go), and to AppURL if
// none does. Each URL is parsed once, into a target of its own; a batch
// holds the messages of one target (batcher.go).

// target is where a request goes: AppURL's endpoint or a route's, and why
// its URL cannot be parsed (each request to it then fails, so that the
// message is retried and dead-lettered with the reason, as for AppURL).
type target struct {
	ep  *apphttp.Endpoint
	err error
}

// newTargets parses AppURL (target 0) and each route's URL, in order.
func newTargets(o Options) []target {
	out := make([]target, 0, 1+len(o.Routes))
	ep, err := apphttp.NewEndpoint(o.Client, o.AppURL, o.ownClient)
	out = append(out, target{ep: ep, err: err})
	for _, rt := range o.Routes {
		ep, err := apphttp.NewEndpoint(o.Client, rt.URL, o.ownClient)
		out = append(out, target{ep: ep, err: err})
	}
	return out
}
