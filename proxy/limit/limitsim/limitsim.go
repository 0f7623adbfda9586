// Package limitsim measures a limit.Limiter against an app simulated in
// process: a pool of workers that each take a service time per request, the
// requests beyond them waiting inside the app in FIFO order (as in a server
// with a worker pool), optionally answering 503 beyond a number inside. It
// runs in real time with real goroutines, so it also feels the scheduling
// noise of the machine it runs on. The bench command and the package's
// benchmarks print its figures; nothing asserts on them.
package limitsim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/courierhq/courier/proxy/limit"
)

// ErrOverload is what App.Serve returns when it sheds a request (a 503).
var ErrOverload = errors.New("limitsim: overloaded")

// App is a simulated app. Safe for concurrent use; it starts no goroutine.
type App struct {
	mu        sync.Mutex
	workers   int // 0: as many as come
	service   time.Duration
	shedAbove int // 0: never sheds
	busy      int
	queue     []chan struct{}

	inside int
	area   float64 // ∫ inside dt, in request·seconds
	last   time.Time
	served uint64
	shed   uint64
}

// NewApp returns an app with workers workers (0 for unlimited) that each take
// service per request.
func NewApp(workers int, service time.Duration) *App {
	return &App{workers: workers, service: service, last: time.Now()}
}

// SetWorkers changes the number of workers (0: unlimited); requests being
// served finish.
func (a *App) SetWorkers(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.workers = n
	a.handOffLocked()
}

// SetService changes the time a request takes from the next one served.
func (a *App) SetService(d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.service = d
}

// ShedAbove makes the app answer ErrOverload at once to a request that
// arrives with n or more already inside (0: never).
func (a *App) ShedAbove(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.shedAbove = n
}

func (a *App) accountLocked() {
	now := time.Now()
	a.area += float64(a.inside) * now.Sub(a.last).Seconds()
	a.last = now
}

func (a *App) handOffLocked() {
	for len(a.queue) > 0 && (a.workers == 0 || a.busy < a.workers) {
		a.busy++
		close(a.queue[0])
		a.queue = a.queue[1:]
	}
}

// Serve handles one request: it waits for a worker, takes the service time,
// and returns nil, or ErrOverload at once if the app sheds it.
func (a *App) Serve() error {
	a.mu.Lock()
	if a.shedAbove > 0 && a.inside >= a.shedAbove {
		a.shed++
		a.mu.Unlock()
		return ErrOverload
	}
	a.accountLocked()
	a.inside++
	if a.workers == 0 || a.busy < a.workers && len(a.queue) == 0 {
		a.busy++
		a.mu.Unlock()
	} else {
		ch := make(chan struct{})
		a.queue = append(a.queue, ch)
		a.mu.Unlock()
		<-ch
	}
	a.mu.Lock()
	d := a.service
	a.mu.Unlock()
	if d > 0 {
		time.Sleep(d)
	}
	a.mu.Lock()
	a.accountLocked()
	a.inside--
	a.busy--
	a.served++
	a.handOffLocked()
	a.mu.Unlock()
	return nil
}

// Snapshot is the app's counters at one instant; two make a Span.
type Snapshot struct {
	At     time.Time
	Area   float64
	Served uint64
	Shed   uint64
}

// Snapshot returns the app's counters now.
func (a *App) Snapshot() Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.accountLocked()
	return Snapshot{At: a.last, Area: a.area, Served: a.served, Shed: a.shed}
}

// Span is what an app did between two snapshots.
type Span struct {
	Seconds    float64
	PerSecond  float64 // requests served per second
	MeanInside float64 // requests inside the app, served or waiting, on average
	Shed       float64 // fraction of the requests that came which were shed
}

// Between returns what the app did from s to e.
func Between(s, e Snapshot) Span {
	sec := e.At.Sub(s.At).Seconds()
	served, shed := float64(e.Served-s.Served), float64(e.Shed-s.Shed)
	sp := Span{Seconds: sec}
	if sec > 0 {
		sp.PerSecond = served / sec
		sp.MeanInside = (e.Area - s.Area) / sec
	}
	if served+shed > 0 {
		sp.Shed = shed / (served + shed)
	}
	return sp
}

// Load keeps a backlog flowing through lim into app until ctx ends: clients
// goroutines each take a slot, serve a request, and release the slot with its
// outcome. It returns when every client has stopped.
func Load(ctx context.Context, lim *limit.Limiter, app *App, clients int) {
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				slot, err := lim.Acquire(ctx, limit.Deliver)
				if err != nil {
					return
				}
				out := limit.Success
				if app.Serve() != nil {
					out = limit.Overload
				}
				slot.Release(out)
			}
		})
	}
	wg.Wait()
}

// Case is an app to compare limiters against.
type Case struct {
	Name    string
	Workers int // 0: unlimited
	Service time.Duration
	// ShedAbove, if not 0, makes the app answer 503 to a request that
	// finds that many inside it.
	ShedAbove int
}

// Cases are the apps courier's choice of default is judged on.
func Cases() []Case {
	return []Case{
		{Name: "8 workers x 10ms", Workers: 8, Service: 10 * time.Millisecond},
		{Name: "instant", Workers: 0, Service: 0},
		{Name: "20ms, unlimited workers", Workers: 0, Service: 20 * time.Millisecond},
		{Name: "8x10ms, 503 above 8", Workers: 8, Service: 10 * time.Millisecond, ShedAbove: 8},
	}
}

// Contender is a limiter to compare, made fresh for each run.
type Contender struct {
	Name string
	New  func() *limit.Limiter
}

// Contenders are auto against fixed limits of 8 (courier's default) and 64.
func Contenders() []Contender {
	return []Contender{
		{Name: "auto", New: func() *limit.Limiter { return limit.NewAuto(limit.AutoOptions{}) }},
		{Name: "fixed 8", New: func() *limit.Limiter { return limit.NewFixed(8) }},
		{Name: "fixed 64", New: func() *limit.Limiter { return limit.NewFixed(64) }},
	}
}

// Result is one contender's run against one case, measured after warm-up.
type Result struct {
	Case, Contender string
	Span
	Limit  int           // the limit in effect at the end
	MinRTT time.Duration // the unloaded answer time it assumed at the end
}

// Run loads a fresh app of c through lim for warm+measure and returns what the
// app did during measure.
func Run(ctx context.Context, c Case, name string, lim *limit.Limiter, warm, measure time.Duration) Result {
	app := NewApp(c.Workers, c.Service)
	app.ShedAbove(c.ShedAbove)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Load(ctx, lim, app, 2*max(lim.Stats().Max, 64))
	}()
	var s, e Snapshot
	if sleep(ctx, warm) {
		s = app.Snapshot()
		if sleep(ctx, measure) {
			e = app.Snapshot()
		}
	}
	cancel()
	<-done
	st := lim.Stats()
	return Result{Case: c.Name, Contender: name, Span: Between(s, e), Limit: st.Limit, MinRTT: st.MinRTT}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Compare runs every contender against each of cases and writes a table to w.
func Compare(ctx context.Context, w io.Writer, cases []Case, warm, measure time.Duration) ([]Result, error) {
	var rs []Result
	if _, err := fmt.Fprintf(w, "%-24s %-9s %10s %8s %6s %6s %9s\n", "app", "limit", "req/s", "inside", "shed", "limit", "minRTT"); err != nil {
		return nil, err
	}
	for _, c := range cases {
		for _, k := range Contenders() {
			r := Run(ctx, c, k.Name, k.New(), warm, measure)
			if err := ctx.Err(); err != nil {
				return rs, err
			}
			rs = append(rs, r)
			if _, err := fmt.Fprintf(w, "%-24s %-9s %10.0f %8.1f %5.1f%% %6d %9s\n",
				r.Case, r.Contender, r.PerSecond, r.MeanInside, 100*r.Shed, r.Limit, r.MinRTT.Round(time.Microsecond)); err != nil {
				return rs, err
			}
		}
	}
	return rs, nil
}
