package limit

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// The automatic limit is a gradient controller in the manner of Envoy's
// adaptive concurrency filter (source/extensions/filters/http/adaptive_concurrency
// in envoyproxy/envoy), with AIMD's steps; docs/adaptive-concurrency.md argues
// the choice.
//
//   - Answers are read in windows of at least Interval and MinSamples answers,
//     each window only of requests sent under the limit it judges. A window's
//     typical answer time (mean less the highest and lowest tenth) is compared
//     with target = minRTT×(1+Tolerance) + Slack.
//   - At or under the target, with the limit in use, the limit rises by 1
//     (by √limit while starting, and after three rises in a row).
//   - Over it the app queues: the limit becomes what was in flight ×
//     target/typical (at most halved), which is where the app stops queueing
//     when its answer time grows with the requests inside it (Little's law).
//   - A 429/503 takes a quarter off the limit, a timeout half.
//   - The unloaded answer time (minRTT) is measured, not assumed: at start,
//     every ProbeInterval (plus jitter), after three queueing windows in a row
//     (the app may have got slower), and when a window is well under it (the
//     app got faster), the limit is held at a quarter of itself until
//     ProbeSamples answers of requests sent while held are in (past
//     20×Interval, 3). What they measure is taken, higher or lower than
//     before: held low, the app does not queue for us.
//   - At a limit of 1 each request is alone at the app, so a window read
//     there measures the unloaded answer time itself, and minRTT follows it.
//
// Answers of requests sent before a change are not read after it: a window read
// across a rise would count answers of the lower limit as evidence for the
// higher one, and a burst of queueing or 503s sent under one limit lowers it
// once (TCP reacts once per window of data for the same reason).

// AutoOptions tunes an automatic limit. The zero value of each field takes
// the default it names.
type AutoOptions struct {
	// Max is the ceiling N of auto:N. Default 64.
	Max int
	// Initial is the first limit. Default 4: few enough not to flood an
	// app with a handful of workers before anything is known, and reached
	// past in a few windows by an app that takes more.
	Initial int
	// Interval is the shortest window of answers read at once. Default 100ms.
	Interval time.Duration
	// MinSamples is the fewest answers a window is read with. Default 10; a
	// window past 10×Interval is read with 3.
	MinSamples int
	// Tolerance is how far, as a fraction of minRTT, answer times may grow
	// before the app counts as queueing. Default 0.1.
	Tolerance float64
	// Slack is an absolute allowance added to the target, so that the
	// scheduling noise of a busy machine (a millisecond or two) does not
	// read as queueing at an app that answers in microseconds. Default 1ms.
	Slack time.Duration
	// ProbeInterval is how often minRTT is measured again; up to 15% is
	// added at random so replicas do not measure together. Default 30s.
	ProbeInterval time.Duration
	// ProbeSamples is how many answers measure minRTT. Default 10; a
	// measurement past 20×Interval ends with 3 (the first with 1). It does
	// not end with fewer: held at 1 or 2, an app answering in a second or
	// more gives fewer in that time, and an old minRTT would hold its limit low.
	ProbeSamples int
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

func (o AutoOptions) withDefaults() AutoOptions {
	if o.Max < 1 {
		o.Max = 64
	}
	if o.Initial < 1 {
		o.Initial = 4
	}
	o.Initial = min(o.Initial, o.Max)
	if o.Interval <= 0 {
		o.Interval = 100 * time.Millisecond
	}
	if o.MinSamples < 1 {
		o.MinSamples = 10
	}
	if o.Tolerance <= 0 {
		o.Tolerance = 0.1
	}
	if o.Slack <= 0 {
		o.Slack = time.Millisecond
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = 30 * time.Second
	}
	if o.ProbeSamples < 1 {
		o.ProbeSamples = 10
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// maxWindow bounds the answers kept per window; past it a uniform sample is kept.
const maxWindow = 256

// NewAuto returns a limiter whose limit the app's answers set, between 1 and
// o.Max. It begins by measuring the unloaded answer time with a quarter of
// o.Initial in flight (one request at a time by default).
func NewAuto(o AutoOptions) *Limiter {
	o = o.withDefaults()
	now := o.Now()
	c := &control{
		opts:      o,
		max:       o.Max,
		est:       float64(o.Initial),
		slowStart: true,
		rng:       rand.New(rand.NewPCG(uint64(now.UnixNano()), 0x636f7572)),
	}
	c.startProbe(now)
	return &Limiter{now: o.Now, ctrl: c, limit: c.effective()}
}

// control is the automatic limit's state, guarded by its Limiter's mutex.
type control struct {
	opts AutoOptions
	max  int

	est       float64 // the limit, before rounding and the probe's hold
	minRTT    time.Duration
	slowStart bool // rising by √limit until the app first queues
	rises     int  // windows in a row that rose
	queued    int  // windows in a row that queued

	// epoch advances at each change of the limit and at both ends of a
	// probe; only answers of requests admitted in the current epoch are read.
	epoch    uint64
	winStart time.Time
	win      []time.Duration
	winSeen  int // answers offered to win, for the uniform sample
	winPeak  int // most in flight during the window

	probing   bool
	pin       int
	nextProbe time.Time

	rng *rand.Rand
}

// effective is the limit in effect: the estimate rounded down, or the
// probe's hold.
func (c *control) effective() int {
	n := min(max(int(c.est), 1), c.max)
	if c.probing {
		n = min(n, c.pin)
	}
	return n
}

// admitted notes a request let in with inflight now in flight, and returns
// the epoch it belongs to.
func (c *control) admitted(inflight int) uint64 {
	c.winPeak = max(c.winPeak, inflight)
	return c.epoch
}

func (c *control) newEpoch(now time.Time) {
	c.epoch++
	c.winStart = now
	c.win = c.win[:0]
	c.winSeen = 0
	c.winPeak = 0
}

// observe reads one outcome and returns the limit to put in effect, its
// cause, and whether anything changed.
func (c *control) observe(s *Slot, o Outcome, now time.Time) (int, Cause, bool) {
	before := c.effective()
	cause := c.read(s, o, now)
	after := c.effective()
	return after, cause, cause != CauseNone && after != before
}

func (c *control) read(s *Slot, o Outcome, now time.Time) Cause {
	if s.epoch != c.epoch {
		return c.probeDue(now)
	}
	switch o {
	case Overload:
		return c.decrease(0.75, CauseOverload, now)
	case Timeout:
		return c.decrease(0.5, CauseTimeout, now)
	case Success:
		c.add(now.Sub(s.admitted))
	default:
		return CauseNone
	}
	if c.probing {
		return c.probeRead(now)
	}
	if cause := c.windowRead(now); cause != CauseNone {
		return cause
	}
	return c.probeDue(now)
}

// add keeps an answer time in the window, a uniform sample of at most maxWindow.
func (c *control) add(d time.Duration) {
	c.winSeen++
	if len(c.win) < maxWindow {
		c.win = append(c.win, d)
		return
	}
	if i := c.rng.IntN(c.winSeen); i < maxWindow {
		c.win[i] = d
	}
}

func (c *control) decrease(factor float64, cause Cause, now time.Time) Cause {
	c.est = max(1, c.est*factor)
	c.slowStart, c.rises = false, 0
	c.newEpoch(now)
	return cause
}

// windowRead closes the window when it holds enough and adjusts the limit.
func (c *control) windowRead(now time.Time) Cause {
	age := now.Sub(c.winStart)
	if !(age >= c.opts.Interval && len(c.win) >= c.opts.MinSamples) &&
		!(age >= 10*c.opts.Interval && len(c.win) >= 3) {
		return CauseNone
	}
	typ := typical(c.win)
	peak := c.winPeak
	inUse := peak >= c.effective()
	c.winStart, c.win, c.winSeen, c.winPeak = now, c.win[:0], 0, 0
	if c.effective() == 1 {
		// Every answer read here is of a request admitted with the
		// limit at 1 (a change of the limit starts a new epoch), so
		// alone at the app: none queued behind ours, and this is the
		// unloaded answer time, higher or lower than minRTT. An app
		// that got slower is not held at 1 by an old, lower minimum.
		c.measured(typ)
	} else if typ < c.minRTT {
		faster := float64(typ)*(1+c.opts.Tolerance) < float64(c.minRTT)
		c.minRTT = typ
		if faster {
			// The app got faster: typ was read under load, so measure
			// the unloaded time now rather than at the next probe.
			c.startProbe(now)
			return CauseProbe
		}
	}
	target := time.Duration(float64(c.minRTT)*(1+c.opts.Tolerance)) + c.opts.Slack
	if typ <= target {
		c.queued = 0
		if !inUse {
			// Nothing learnt about more requests than were sent.
			c.rises = 0
			return CauseNone
		}
		step := 1.0
		if c.slowStart || c.rises >= 3 {
			step = max(1, math.Sqrt(c.est))
		}
		c.rises++
		c.est = min(float64(c.max), c.est+step)
		c.newEpoch(now)
		return CauseRise
	}
	c.queued++
	c.rises, c.slowStart = 0, false
	g := max(0.5, float64(target)/float64(typ))
	c.est = max(1, min(c.est, float64(peak))*g)
	c.newEpoch(now)
	if c.queued >= 3 {
		c.queued = 0
		c.startProbe(now)
	}
	return CauseQueueing
}

// probeDue starts a periodic measurement of minRTT when one is due.
func (c *control) probeDue(now time.Time) Cause {
	if c.probing || now.Before(c.nextProbe) {
		return CauseNone
	}
	c.startProbe(now)
	return CauseProbe
}

// startProbe holds the limit at a quarter of itself, low enough to leave no
// queue at an app whose limit was near its capacity; from a limit far above
// the capacity the measure is too high but still under the loaded answer time,
// so the limit still falls, and the next measurement is right.
func (c *control) startProbe(now time.Time) {
	c.probing = true
	c.pin = max(1, int(c.est/4))
	c.newEpoch(now)
}

// probeRead ends a measurement of minRTT once it has its answers, and takes
// what they measure even when it is higher than the minRTT before: the limit
// was held low, so the app answered them without queueing for us.
//
// A measurement that runs long ends with 3 answers rather than ProbeSamples,
// to keep the limit held low for a short time only; it never ends with fewer.
// An app answering in a second or more with the limit held at 1 or 2 gives
// fewer than 3 in 20×Interval, and ending without a measure there would keep
// an old minimum the app can no longer meet: every window would then read as
// queueing and take the limit down to 1. Three answers take three of the
// app's answer times at most, however slow it is.
func (c *control) probeRead(now time.Time) Cause {
	enough := len(c.win) >= c.opts.ProbeSamples
	long := now.Sub(c.winStart) >= 20*c.opts.Interval &&
		(len(c.win) >= 3 || c.minRTT == 0) // the first measure: any beats none
	if !enough && !long {
		return CauseNone
	}
	c.measured(typical(c.win))
	c.probing = false
	c.queued = 0
	jitter := time.Duration(c.rng.Int64N(int64(c.opts.ProbeInterval)*15/100 + 1))
	c.nextProbe = now.Add(c.opts.ProbeInterval + jitter)
	c.newEpoch(now)
	return CauseProbe
}

// measured takes m as the unloaded answer time.
func (c *control) measured(m time.Duration) {
	if c.minRTT > 0 && (m > 2*c.minRTT || 2*m < c.minRTT) {
		// The app changed a lot: what the limit was is no guide.
		c.slowStart = true
	}
	c.minRTT = m
}

// typical is the mean of the answer times less the highest and lowest tenth.
// A mean because the requests inside the app grow with the mean answer time
// (Little's law), where a median can stay put while half of them wait; trimmed
// because a noisy machine delays a few answers a lot.
func typical(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	cut := len(s) / 10
	s = s[cut : len(s)-cut]
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return sum / time.Duration(len(s))
}
