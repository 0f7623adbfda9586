package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// cluster is an embedded 3-node JetStream cluster on loopback, as the
// rollout scenario runs courier (rollout.go): an R3 stream, couriers spread
// over the nodes. It is started like internal/natstest's cluster, which
// needs a testing.TB. Its owner must call close.
type cluster struct {
	nodes []*server.Server
	nc    *nats.Conn
	js    jetstream.JetStream
}

// startCluster starts n nodes storing under dir, routed to each other,
// and connects to them once JetStream has a meta leader.
func startCluster(dir string, n int) (*cluster, error) {
	ports := make([]int, n)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	routes := make([]*url.URL, n)
	for i, p := range ports {
		routes[i] = &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", p)}
	}
	c := &cluster{nodes: make([]*server.Server, n)}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			s, err := server.NewServer(&server.Options{
				ServerName: fmt.Sprintf("n%d", i), Host: "127.0.0.1", Port: server.RANDOM_PORT,
				JetStream: true, StoreDir: filepath.Join(dir, fmt.Sprint("n", i)),
				JetStreamMaxMemory: 256 << 20, JetStreamMaxStore: 4 << 30, NoLog: true, NoSigs: true,
				Cluster: server.ClusterOpts{Name: "bench", Host: "127.0.0.1", Port: ports[i]}, Routes: routes,
			})
			if err != nil {
				errs[i] = err
				return
			}
			go s.Start()
			if !s.ReadyForConnections(20 * time.Second) {
				errs[i] = fmt.Errorf("node %d not ready within 20s", i)
			}
			c.nodes[i] = s
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.close()
		return nil, fmt.Errorf("nats-server cluster: %w", err)
	}
	nc, err := nats.Connect(c.URL())
	if err != nil {
		c.close()
		return nil, err
	}
	c.nc = nc
	if c.js, err = jetstream.New(nc); err != nil {
		c.close()
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		leader, current := false, true
		for _, s := range c.nodes {
			leader = leader || s.JetStreamIsLeader()
			current = current && s.JetStreamIsCurrent()
		}
		if leader && current {
			return c, nil
		}
		if time.Now().After(deadline) {
			c.close()
			return nil, errors.New("nats-server cluster: no JetStream meta leader within 30s")
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// URL lists every node's client URL.
func (c *cluster) URL() string {
	urls := make([]string, 0, len(c.nodes))
	for _, s := range c.nodes {
		if s != nil {
			urls = append(urls, s.ClientURL())
		}
	}
	return strings.Join(urls, ",")
}

// nodeFirst lists node i's URL first, then every node's: couriers spread
// over the nodes.
func (c *cluster) nodeFirst(i int) string {
	return c.nodes[i%len(c.nodes)].ClientURL() + "," + c.URL()
}

// close drops the connection and shuts every node down.
func (c *cluster) close() {
	if c.nc != nil {
		c.nc.Close()
	}
	for _, s := range c.nodes {
		if s != nil {
			s.Shutdown()
			s.WaitForShutdown()
		}
	}
}

// freePort returns a loopback port free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
