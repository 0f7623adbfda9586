package natstest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ClusterOptions adjusts an embedded cluster. The zero value is a loopback
// cluster named "courier-test".
type ClusterOptions struct {
	// Name is the cluster name; empty means "courier-test".
	Name string
	// Configure, when set, is called on each node's options before it
	// starts (i is the node's index).
	Configure func(i int, o *server.Options)
}

// Cluster is an embedded JetStream cluster of in-process servers on
// loopback, each with its own StoreDir and fixed ports, so a node can be
// shut down and restarted where it was. Its methods are safe for concurrent
// use.
type Cluster struct {
	tb    testing.TB
	mu    sync.Mutex
	opts  []*server.Options
	nodes []*server.Server // nil while a node is shut down
	dir   string           // the nodes' store dirs are made in it
}

// StartCluster starts n servers routed to each other with JetStream on each,
// waits until a JetStream meta leader is elected and every node is current,
// and shuts them all down when the test ends.
//
// The cluster ports are chosen before the servers start (a JetStream cluster
// needs configured routes on every node, its own included), so another
// process, or another test's server listening on a random port, can take
// one in between: a node that cannot listen on its cluster port is never
// ready. The cluster is then started again on other ports, up to three
// times. The client ports are random and read back once bound, then kept
// for restarts.
func StartCluster(tb testing.TB, n int, o ClusterOptions) *Cluster {
	tb.Helper()
	if n < 1 {
		tb.Fatalf("natstest: cluster of %d nodes", n)
	}
	name := o.Name
	if name == "" {
		name = "courier-test"
	}
	c := &Cluster{tb: tb, opts: make([]*server.Options, n), nodes: make([]*server.Server, n)}
	// The nodes' store dirs are made under one made now, whose removal is
	// then registered before the nodes' shutdown: cleanups run last first,
	// so every node stops before its files go (a node still writing made
	// the removal fail).
	c.dir = tb.TempDir()
	tb.Cleanup(c.shutdownAll)
	const attempts = 3
	for attempt := 1; ; attempt++ {
		err := c.start(name, freePorts(tb, n), o.Configure)
		if err == nil {
			break
		}
		c.shutdownAll()
		if attempt == attempts {
			tb.Fatalf("natstest: cluster not started in %d attempts: %v", attempts, err)
		}
		tb.Logf("natstest: %v; starting the cluster again on other ports", err)
	}
	c.WaitReady()
	return c
}

// start starts every node of c on the cluster ports given, together (a node
// waits for its routes before it is ready), and returns the first node's
// failure.
func (c *Cluster) start(name string, ports []int, configure func(int, *server.Options)) error {
	n := len(ports)
	routes := make([]*url.URL, n)
	for i, p := range ports {
		routes[i] = &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", p)}
	}
	for i := range n {
		opts := &server.Options{
			ServerName:         fmt.Sprintf("n%d", i),
			Host:               "127.0.0.1",
			Port:               server.RANDOM_PORT,
			JetStream:          true,
			StoreDir:           c.storeDir(),
			JetStreamMaxMemory: 256 << 20,
			JetStreamMaxStore:  1 << 30,
			NoLog:              true,
			NoSigs:             true,
			Cluster:            server.ClusterOpts{Name: name, Host: "127.0.0.1", Port: ports[i]},
			Routes:             routes,
		}
		if configure != nil {
			configure(i, opts)
		}
		c.opts[i] = opts
	}
	nodes := make([]*server.Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { nodes[i], errs[i] = startNode(c.opts[i]) })
	}
	wg.Wait()
	c.mu.Lock()
	copy(c.nodes, nodes)
	c.mu.Unlock()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("cluster node %d (cluster port %d): %w", i, ports[i], err)
		}
	}
	for i, s := range nodes {
		// Keep the bound client port for a restart.
		c.opts[i].Port = s.Addr().(*net.TCPAddr).Port
	}
	return nil
}

// freePorts returns n loopback ports free a moment ago.
func freePorts(tb testing.TB, n int) []int {
	tb.Helper()
	ports := make([]int, n)
	ls := make([]net.Listener, n)
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatalf("natstest: pick a port: %v", err)
		}
		ls[i] = l
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range ls {
		_ = l.Close()
	}
	return ports
}

// startNode starts a server on a copy of opts and waits until it is ready.
// A server that cannot listen (on its cluster port, taken meanwhile) says so
// only in its log, and is never ready: its fatal log line ends the wait.
func startNode(opts *server.Options) (*server.Server, error) {
	// The server keeps and may change the options it is given.
	o := opts.Clone()
	s, err := server.NewServer(o)
	if err != nil {
		return nil, err
	}
	fatal := &fatalLogger{}
	s.SetLoggerV2(fatal, false, false, false)
	go s.Start()
	deadline := time.Now().Add(20 * time.Second)
	for !s.ReadyForConnections(50 * time.Millisecond) {
		if err := fatal.err(); err != nil || time.Now().After(deadline) {
			s.Shutdown()
			if err == nil {
				err = fmt.Errorf("not ready after 20s")
			}
			return nil, err
		}
	}
	return s, nil
}

// fatalLogger keeps a server's first fatal log line and drops the rest.
type fatalLogger struct {
	mu    sync.Mutex
	fatal error
}

func (l *fatalLogger) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatal
}

func (l *fatalLogger) Fatalf(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fatal == nil {
		l.fatal = fmt.Errorf(format, v...)
	}
}

func (*fatalLogger) Noticef(string, ...any) {}
func (*fatalLogger) Warnf(string, ...any)   {}
func (*fatalLogger) Errorf(string, ...any)  {}
func (*fatalLogger) Debugf(string, ...any)  {}
func (*fatalLogger) Tracef(string, ...any)  {}

// Node returns node i, nil while it is shut down.
func (c *Cluster) Node(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// Len is the number of nodes, running or not.
func (c *Cluster) Len() int { return len(c.opts) }

// URL is the client URL of every node, comma separated (a nats.Connect
// argument that fails over between them).
func (c *Cluster) URL() string {
	urls := make([]string, len(c.opts))
	for i, o := range c.opts {
		urls[i] = fmt.Sprintf("nats://127.0.0.1:%d", o.Port)
	}
	return strings.Join(urls, ",")
}

// NodeURL is node i's client URL, whether it runs or not.
func (c *Cluster) NodeURL(i int) string {
	return fmt.Sprintf("nats://127.0.0.1:%d", c.opts[i].Port)
}

// Shutdown stops node i and waits for it; a node already down is left so.
func (c *Cluster) Shutdown(i int) {
	c.mu.Lock()
	s := c.nodes[i]
	c.nodes[i] = nil
	c.mu.Unlock()
	if s != nil {
		Stop(s)
	}
}

// Restart starts node i again, with its StoreDir and ports, after
// Shutdown, and waits until it has caught up with the meta leader.
func (c *Cluster) Restart(i int) *server.Server {
	c.tb.Helper()
	c.mu.Lock()
	if c.nodes[i] != nil {
		c.mu.Unlock()
		c.tb.Fatalf("natstest: node %d restarted while running", i)
	}
	c.mu.Unlock()
	s, err := startNode(c.opts[i])
	if err != nil {
		c.tb.Fatalf("natstest: restart node %d: %v", i, err)
	}
	c.mu.Lock()
	c.nodes[i] = s
	c.mu.Unlock()
	c.WaitReady()
	return s
}

// WaitReady waits until a running node is the JetStream meta leader and
// every running node is current with it.
func (c *Cluster) WaitReady() {
	c.tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		leader, current := false, true
		c.mu.Lock()
		for _, s := range c.nodes {
			if s == nil {
				continue
			}
			leader = leader || s.JetStreamIsLeader()
			current = current && s.JetStreamIsCurrent()
		}
		c.mu.Unlock()
		if leader && current {
			return
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("natstest: no JetStream meta leader after 30s")
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// StreamLeader waits (up to 20s) for a leader of stream in the global
// account and returns its node index.
func (c *Cluster) StreamLeader(stream string) int {
	c.tb.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c.mu.Lock()
		for i, s := range c.nodes {
			if s != nil && s.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
				c.mu.Unlock()
				return i
			}
		}
		c.mu.Unlock()
		if time.Now().After(deadline) {
			c.tb.Fatalf("natstest: no leader for stream %s after 20s", stream)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// ConsumerLeader waits (up to 20s) for a leader of consumer on stream in
// the global account and returns its node index.
func (c *Cluster) ConsumerLeader(stream, consumer string) int {
	c.tb.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c.mu.Lock()
		for i, s := range c.nodes {
			if s != nil && s.JetStreamIsConsumerLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream, consumer) {
				c.mu.Unlock()
				return i
			}
		}
		c.mu.Unlock()
		if time.Now().After(deadline) {
			c.tb.Fatalf("natstest: no leader for consumer %s on stream %s after 20s", consumer, stream)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func (c *Cluster) shutdownAll() {
	for i := range c.opts {
		c.Shutdown(i)
	}
}

// Try runs a JetStream API call until it succeeds, in attempts of 10s for
// up to a minute, as courier's own start-up does: on a loaded machine a
// request to a cluster just formed (creating an R3 stream or bucket, whose
// group must elect a leader first) can go unanswered or be refused for a
// while (no meta leader yet, peers not yet known), and one long wait may
// never end where a second request is answered at once. Each failed
// attempt is logged; tb fails if the minute runs out.
func Try(tb testing.TB, what string, f func(ctx context.Context) error) {
	tb.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := f(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: still failing after a minute: %v", what, err)
		}
		tb.Logf("%s: %v; trying again", what, err)
		time.Sleep(100 * time.Millisecond)
	}
}

// storeDir makes a new store dir for a node under c.dir.
func (c *Cluster) storeDir() string {
	dir, err := os.MkdirTemp(c.dir, "node")
	if err != nil {
		c.tb.Fatalf("natstest: store dir: %v", err)
	}
	return dir
}
