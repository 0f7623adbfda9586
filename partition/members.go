package partition

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/jsutil"
)

// Membership: every courier of the durable puts a key of its own in a
// bucket (members.<instance>) every Interval; the bucket's TTL removes the
// key of one that stopped (killed), leaving a marker that watchers see, and
// one that stops cleanly deletes its key. Each courier watches the bucket
// and computes, from the live members, the partitions it is to pull from
// (Assign). Two couriers may briefly disagree; the pins keep one courier a
// partition at a time meanwhile. The heartbeats are also the couriers'
// liveness (liveness.go): the pins of one whose key went are given up by
// the others, and a courier whose own key may have gone holds nothing.

// MembersBucket is the membership bucket of consumer on stream:
// "COURIER_MEMBERS_<stream>_<consumer>" (characters a bucket name cannot
// hold become "_").
func MembersBucket(stream, consumer string) string {
	return "COURIER_MEMBERS_" + jsutil.NameToken(stream) + "_" + jsutil.NameToken(consumer)
}

const memberPrefix = "members."

// Member is what a courier says of itself in the bucket.
type Member struct {
	// Instance is its id (InstanceID).
	Instance string `json:"instance"`
	// Pins maps each partition it holds to the pin id the server gave it,
	// as `courier status` matches them with the consumers' pinned clients.
	Pins map[int]string `json:"pins,omitempty"`
}

// InstanceID returns an id for this process: the host name and a random
// suffix, so that two couriers on one host differ.
func InstanceID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return jsutil.NameToken(host) + "-" + hex.EncodeToString(b[:])
}

// Options configure Join.
type Options struct {
	// Instance is this courier's id; default InstanceID().
	Instance string
	// Partitions is how many partitions the durable has. Required.
	Partitions int
	// Interval is how often the key is put again; default 1s. TTL is how
	// long it lives without (the bucket's TTL, whole seconds); default
	// three intervals.
	Interval, TTL time.Duration
	// Replicas of the bucket; default 1.
	Replicas int
	// Pins, when set, returns the pins held now, put with each heartbeat.
	Pins func() map[int]string
	// Owner, when set, is the durable the bucket is for: recorded in its
	// metadata when it is made, and a bucket of another durable (whose
	// names make the same bucket name) is refused (jsutil.OwnedKeyValue).
	Owner jsutil.Owner
	// Logger; default discards.
	Logger *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Members is this courier's membership. Create it with Join, then call Run
// once (or Start); Assigned and Instance are safe for concurrent use.
type Members struct {
	o   Options
	js  jetstream.JetStream
	cfg jetstream.KeyValueConfig // the bucket's, made again if it is deleted
	kv  jetstream.KeyValue
	log *slog.Logger
	// w is the watch of the members' keys, alive until stopWatch (its
	// subscription ends with the context it was made with).
	w         jetstream.KeyWatcher
	stopWatch context.CancelFunc

	mu       sync.Mutex
	seen     map[string]time.Time // member → when its key was last put (this clock)
	assigned []int
	changed  chan struct{} // closed at the next change of assigned
	// What liveness.go keeps: the pins each member names, those of
	// members gone, and this courier's own term.
	live
}

// Join creates or updates the bucket, puts this courier's key, and reads
// the members there are, so that Assigned answers at once.
func Join(ctx context.Context, js jetstream.JetStream, bucket string, o Options) (*Members, error) {
	if o.Partitions < 1 {
		return nil, errors.New("partition: Options.Partitions is required")
	}
	if o.Instance == "" {
		o.Instance = InstanceID()
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.TTL <= 0 {
		o.TTL = 3 * o.Interval
	}
	o.TTL = max(o.TTL.Round(time.Second), time.Second)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	cfg := jetstream.KeyValueConfig{
		Bucket:         bucket,
		Description:    "courier: the live replicas of a partitioned durable (COURIER_ORDER_PARTITIONS)",
		History:        1,
		TTL:            o.TTL,
		LimitMarkerTTL: o.TTL,
		Storage:        jetstream.FileStorage,
		Replicas:       max(o.Replicas, 1),
	}
	var kv jetstream.KeyValue
	var err error
	if o.Owner != (jsutil.Owner{}) {
		kv, err = jsutil.OwnedKeyValue(ctx, js, cfg, o.Owner)
	} else {
		kv, err = js.CreateOrUpdateKeyValue(ctx, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("membership bucket %s: %w", bucket, err)
	}
	m := &Members{o: o, js: js, cfg: cfg, kv: kv, log: o.Logger.With("component", "partitions", "instance", o.Instance),
		seen: map[string]time.Time{}, changed: make(chan struct{}), live: newLive()}
	if err := m.put(ctx); err != nil {
		return nil, fmt.Errorf("membership bucket %s: %w", bucket, err)
	}
	if err := m.watch(ctx); err != nil {
		return nil, fmt.Errorf("membership bucket %s: %w", bucket, err)
	}
	m.reassign()
	return m, nil
}

// watch starts the watch of the members' keys and takes the values there
// are. The watch lives until stopWatch, not as long as ctx: nats.go ends a
// watch's subscription with the context it was made with.
func (m *Members) watch(ctx context.Context) error {
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	abort := context.AfterFunc(ctx, stop) // ctx bounds the making only
	w, err := m.kv.Watch(wctx, memberPrefix+">")
	if !abort() || err != nil {
		stop()
		if err == nil {
			err = ctx.Err()
		}
		return err
	}
	var entries []jetstream.KeyValueEntry
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				stop()
				return errors.New("watch ended")
			}
			if e != nil {
				entries = append(entries, e)
				continue
			}
			// The values there were: what follows is news. A member
			// known before and absent now left while the watch was down.
			m.mu.Lock()
			now := m.o.Now()
			was := m.seen
			m.seen = map[string]time.Time{}
			for _, e := range entries {
				m.note(e, now)
			}
			for id := range was {
				if _, ok := m.seen[id]; !ok {
					m.left(id, now)
				}
			}
			m.mu.Unlock()
			m.w, m.stopWatch = w, stop
			return nil
		case <-ctx.Done():
			stop()
			return ctx.Err()
		}
	}
}

// Instance is this courier's id.
func (m *Members) Instance() string { return m.o.Instance }

// Assigned returns the partitions this courier is to pull from, in
// increasing order, and a channel closed when they change.
func (m *Members) Assigned() ([]int, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.assigned), m.changed
}

// Run keeps the key alive and follows the others until ctx ends, then
// deletes the key (the others take this courier's partitions at once).
func (m *Members) Run(ctx context.Context) {
	defer func() {
		m.stopWatch()
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		if err := m.kv.Delete(lctx, memberPrefix+m.o.Instance); err != nil {
			m.log.Warn("cannot leave the membership; the others take this courier's partitions once its key expires", "error", err, "ttl", m.o.TTL.String())
		}
	}()
	t := time.NewTicker(m.o.Interval)
	defer t.Stop()
	failing := false
	updates := m.w.Updates()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-updates:
			if !ok {
				// The connection closed, or the bucket is gone: watched
				// again at the next tick.
				m.log.Warn("the watch of the membership ended; watching again")
				m.stopWatch()
				updates = nil
				continue
			}
			if e != nil {
				m.mu.Lock()
				m.note(e, m.o.Now())
				m.mu.Unlock()
				m.reassign()
			}
		case <-t.C:
			if updates == nil {
				wctx, cancel := context.WithTimeout(ctx, m.o.Interval)
				if m.watch(wctx) == nil {
					updates = m.w.Updates()
				}
				cancel()
			}
			pctx, cancel := context.WithTimeout(ctx, m.o.Interval)
			err := m.put(pctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				err = m.makeAgain(ctx, err)
			}
			switch {
			case err != nil && !failing && ctx.Err() == nil:
				failing = true
				m.log.Warn("cannot renew this courier's membership; the others take its partitions if it lapses", "error", err)
			case err == nil && failing:
				failing = false
				m.log.Info("membership renewed again")
			}
			m.reassign()
		}
	}
}

// makeAgain, after a heartbeat failed with err, makes the bucket again if
// it was deleted (by hand, while couriers run), and puts this courier's
// key: else every courier's term would stay lapsed. It returns err if the
// bucket is there.
func (m *Members) makeAgain(ctx context.Context, err error) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, kerr := m.js.KeyValue(ctx, m.cfg.Bucket); !errors.Is(kerr, jetstream.ErrBucketNotFound) {
		return err
	}
	if _, err := m.js.CreateOrUpdateKeyValue(ctx, m.cfg); err != nil {
		return err
	}
	return m.put(ctx)
}

// Start runs Run in a goroutine of its own until ctx ends (the stop
// signal), and returns stop, which ends it if ctx has not and waits until
// it has left the membership: whoever called Start must call stop (at
// close, or when a start-up step after Join failed). stop may be called
// more than once.
func (m *Members) Start(ctx context.Context) (stop func()) {
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); m.Run(rctx) }()
	return sync.OnceFunc(func() { cancel(); <-done })
}

// put puts this courier's key, naming its pins; once stored, its term is
// renewed from when it was sent (renewed).
func (m *Members) put(ctx context.Context) error {
	v := Member{Instance: m.o.Instance}
	if m.o.Pins != nil {
		v.Pins = m.o.Pins()
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	sent := m.o.Now()
	if _, err = m.kv.Put(ctx, memberPrefix+m.o.Instance, b); err != nil {
		return err
	}
	m.mu.Lock()
	m.renewed(sent)
	m.mu.Unlock()
	return nil
}

// note takes one entry of the watch in, at now. Called with mu held.
func (m *Members) note(e jetstream.KeyValueEntry, now time.Time) {
	id := strings.TrimPrefix(e.Key(), memberPrefix)
	switch e.Operation() {
	case jetstream.KeyValuePut:
		m.seen[id] = now
		var mb Member
		_ = json.Unmarshal(e.Value(), &mb)
		m.named(id, mb.Pins)
	default: // deleted (stopped) or purged by the TTL (killed)
		delete(m.seen, id)
		m.left(id, now)
	}
}

// reassign recomputes the partitions of this courier from the members
// seen. A member not heard of for two TTLs is dropped here even if no
// marker said so; this courier is always a member of its own view.
func (m *Members) reassign() {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.o.Now()
	live := []string{m.o.Instance}
	for id, at := range m.seen {
		if now.Sub(at) > 2*m.o.TTL {
			delete(m.seen, id)
			m.left(id, now)
			continue
		}
		if id != m.o.Instance {
			live = append(live, id)
		}
	}
	got := Assign(live, m.o.Instance, m.o.Partitions)
	if slices.Equal(got, m.assigned) {
		return
	}
	slices.Sort(live)
	m.log.Info("partitions assigned", "partitions", formatList(got), "members", strings.Join(live, ","))
	m.assigned = got
	close(m.changed)
	m.changed = make(chan struct{})
}

func formatList(ps []int) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

// handedKey is the record that partition i was handed on cleanly.
func handedKey(i int) string { return "handed." + strconv.Itoa(i) }

// HandedOn records that this courier handed partition i on holding nothing
// of it, before it gives the pin up (proxy.Partitions.HandedOn). The record
// lives for the bucket's TTL.
func (m *Members) HandedOn(ctx context.Context, i int) error {
	_, err := m.kv.Put(ctx, handedKey(i), []byte(m.o.Instance))
	return err
}

// TakeHandedOn reports whether partition i was handed on (HandedOn) no
// more than window before pinnedAt, when the server gave this courier the
// pin (both the server's times), and removes the record
// (proxy.Partitions.Clean). A record from after the pin, or older than the
// consumer's pinned TTL (another courier may have held the pin between),
// does not count.
func (m *Members) TakeHandedOn(ctx context.Context, i int, pinnedAt time.Time, window time.Duration) bool {
	e, err := m.kv.Get(ctx, handedKey(i))
	if err != nil {
		return false
	}
	_ = m.kv.Delete(ctx, handedKey(i), jetstream.LastRevision(e.Revision()))
	gap := pinnedAt.Sub(e.Created())
	return gap >= 0 && gap <= window
}

// ReadMembers returns the members in the bucket now, for `courier status`.
func ReadMembers(ctx context.Context, js jetstream.JetStream, bucket string) ([]Member, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, err
	}
	keys, err := kv.ListKeysFiltered(ctx, memberPrefix+">")
	if err != nil {
		return nil, err
	}
	var ids []string
	for k := range keys.Keys() {
		ids = append(ids, k)
	}
	var out []Member
	for _, k := range ids {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var mb Member
		if json.Unmarshal(e.Value(), &mb) != nil || mb.Instance == "" {
			mb.Instance = strings.TrimPrefix(k, memberPrefix)
		}
		out = append(out, mb)
	}
	return out, nil
}
