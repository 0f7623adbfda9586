package main

import (
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
)

// loop is what health asks once the delivery loop runs: proxy.Runner.
type loop interface {
	Ready() error
	Alive() error
}

// health answers /healthz and /readyz for the whole sidecar, in one place.
// Until the delivery loop runs, /readyz names the start-up step courier is
// at and /healthz passes (an unreachable server must not get courier
// restarted); then /readyz needs the connection and the loop's own verdict,
// and /healthz the loop's. Safe for concurrent use.
type health struct {
	mu   sync.Mutex
	step string // why not ready; "" while the loop runs
	nc   *nats.Conn
	loop loop
}

func newHealth() *health { return &health{step: "starting"} }

// at records the start-up or shutdown step courier is at: not ready.
func (h *health) at(step string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.step = step
}

// running hands the checks to the connection and the delivery loop.
func (h *health) running(nc *nats.Conn, l loop) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.step, h.nc, h.loop = "", nc, l
}

func (h *health) state() (string, *nats.Conn, loop) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.step, h.nc, h.loop
}

// Alive is /healthz.
func (h *health) Alive() error {
	if _, _, l := h.state(); l != nil {
		return l.Alive()
	}
	return nil
}

// Ready is /readyz.
func (h *health) Ready() error {
	step, nc, l := h.state()
	switch {
	case step != "":
		return errors.New(step)
	case nc != nil && !nc.IsConnected():
		return fmt.Errorf("not connected to NATS (%s)", nc.Status())
	case l != nil:
		return l.Ready()
	}
	return errors.New("starting")
}
