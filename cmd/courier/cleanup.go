package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/giveup"
	"github.com/courierhq/courier/internal/jsutil"
	"github.com/courierhq/courier/ordermark"
	"github.com/courierhq/courier/partition"
	"github.com/courierhq/courier/rewind"
)

const cleanupUsage = `Usage:
  courier cleanup [--dry-run] [--yes] [--force]

Removes from the server what courier created for COURIER_CONSUMER of
COURIER_STREAM, in the same environment as the sidecar (COURIER_APP_URL is
not needed):

  - the durable consumer: only if courier created it, and not while a
    courier pulls from it;
  - the stream capturing its max-deliveries advisories (and the durable on
    it): only if no advisory waits to be turned into a dead letter, and not
    while a courier pulls from the durable;
  - the dead-letter stream: only if courier created it and it holds no dead
    letter (replay or purge them first: 'courier dlq'), and not while a
    courier pulls from the durable;
  - the key-value bucket of order per key's marks (COURIER_ORDER_KEY): only
    if courier created it, and not while the consumer is kept (a courier
    that starts on it reads them).
  - with COURIER_ORDER_PARTITIONS, the partitions' work stream (with their
    consumers; not while a courier pulls from them), the membership bucket
    and the partitions' order marks bucket.

--force lifts those conditions (a dead-letter stream that holds dead letters
is then deleted with them). Never removed: the stream courier consumes, a
dead-letter stream courier did not create, the shared dedup bucket (it holds
every consumer's keys) and the local COURIER_DEDUP_DIR.

cleanup lists what it will remove and what it keeps, then asks for
confirmation on a terminal; elsewhere it needs --yes. --dry-run only lists.
`

// runCleanup runs `courier cleanup`.
func runCleanup(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("courier cleanup", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var opts cleanupOptions
	fs.BoolVar(&opts.dryRun, "dry-run", false, "")
	fs.BoolVar(&opts.yes, "yes", false, "")
	fs.BoolVar(&opts.force, "force", false, "")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, cleanupUsage)
		return nil
	} else if err != nil {
		return usageError("cleanup: %v (see 'courier cleanup --help')", err)
	}
	if fs.NArg() > 0 {
		return usageError("cleanup takes no arguments, only flags (see 'courier cleanup --help')")
	}
	cfg, err := loadConfigWithoutApp(environ)
	if err != nil {
		return err
	}
	if !cfg.ConsumesStream() {
		return usageError("cleanup needs COURIER_STREAM: it removes what courier created for a consumer of a stream")
	}
	if isTerminal(stdout) && isTerminal(os.Stdin) {
		opts.confirm = func(prompt string) bool {
			fmt.Fprint(stdout, prompt)
			answer, _ := bufio.NewReader(os.Stdin).ReadString('\n')
			answer = strings.ToLower(strings.TrimSpace(answer))
			return answer == "y" || answer == "yes"
		}
	}

	js, closeConn, err := connectCLI(cfg, "cleanup", stderr)
	if err != nil {
		return err
	}
	defer closeConn()
	return cleanup(ctx, js, cfg, opts, stdout)
}

type cleanupOptions struct {
	dryRun, yes, force bool
	// confirm asks the user, on a terminal; nil elsewhere.
	confirm func(prompt string) bool
}

// item is one thing cleanup found: removed, or kept and why.
type item struct {
	what   string
	keep   string                          // why it is kept; "" to remove it
	remove func(ctx context.Context) error // nil when kept
}

// cleanup lists what it will remove and keep, asks, and removes.
func cleanup(ctx context.Context, js jetstream.JetStream, cfg config.Config, opts cleanupOptions, stdout io.Writer) error {
	items, err := cleanupPlan(ctx, js, cfg, opts.force)
	if err != nil {
		return err
	}
	// A stream that is gone may have left what courier made for it; a
	// stream that never was is most likely misspelt.
	missing := missingStream(ctx, js, cfg.Stream)
	if missing != nil && !slices.ContainsFunc(items, func(it item) bool { return it.keep == "" }) {
		return missing
	}
	fmt.Fprintf(stdout, "courier cleanup: consumer %q of stream %q\n", cfg.Consumer, cfg.Stream)
	if missing != nil {
		fmt.Fprintf(stdout, "note: %v\n", missing)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	n := 0
	for _, it := range items {
		if it.keep != "" {
			fmt.Fprintf(tw, "  keep  \t%s\t%s\n", it.what, it.keep)
			continue
		}
		n++
		fmt.Fprintf(tw, "  remove\t%s\t\n", it.what)
	}
	tw.Flush()
	switch {
	case n == 0:
		fmt.Fprintln(stdout, "nothing to remove")
		return nil
	case opts.dryRun:
		fmt.Fprintf(stdout, "dry run: would remove %d, nothing changed\n", n)
		return nil
	case !opts.yes && opts.confirm == nil:
		return usageError("cleanup removes the above for good: add --yes to confirm")
	case !opts.yes && !opts.confirm(fmt.Sprintf("Remove %d? [y/N] ", n)):
		fmt.Fprintln(stdout, "nothing changed")
		return nil
	}
	var failed int
	for _, it := range items {
		if it.keep != "" {
			continue
		}
		if err := it.remove(ctx); err != nil {
			failed++
			fmt.Fprintf(stdout, "failed to remove %s: %v\n", it.what, err)
			continue
		}
		fmt.Fprintf(stdout, "removed %s\n", it.what)
	}
	if failed > 0 {
		return fmt.Errorf("cleanup: %d of %d not removed", failed, n)
	}
	return nil
}

// cleanupPlan finds what courier created for the consumer, in the order it
// is removed: the consumer first, so that no courier starts delivering
// midway.
func cleanupPlan(ctx context.Context, js jetstream.JetStream, cfg config.Config, force bool) ([]item, error) {
	var items []item
	// The durable, then the partitions it is split into
	// (COURIER_ORDER_PARTITIONS), then the rest.
	plans := []func(context.Context, jetstream.JetStream, config.Config, bool) ([]item, error){
		one(planConsumer), planPartitions, one(planAdvisories), one(planDeadLetters), one(planOrderMarks), one(planPinHolders), one(planRewinds),
	}
	for _, find := range plans {
		found, err := find(ctx, js, cfg, force)
		if err != nil {
			return nil, err
		}
		items = append(items, found...)
	}
	return append(items, item{
		what: fmt.Sprintf("stream %q", cfg.Stream),
		keep: "the stream courier consumes is never removed",
	}), nil
}

// one makes a plan of at most one item a plan of a list.
func one(plan func(context.Context, jetstream.JetStream, config.Config, bool) (*item, error)) func(context.Context, jetstream.JetStream, config.Config, bool) ([]item, error) {
	return func(ctx context.Context, js jetstream.JetStream, cfg config.Config, force bool) ([]item, error) {
		it, err := plan(ctx, js, cfg, force)
		if it == nil || err != nil {
			return nil, err
		}
		return []item{*it}, nil
	}
}

func planConsumer(ctx context.Context, js jetstream.JetStream, cfg config.Config, force bool) (*item, error) {
	c, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrConsumerNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("looking up consumer %q on stream %q: %w", cfg.Consumer, cfg.Stream, err)
	}
	info := c.CachedInfo()
	it := &item{what: fmt.Sprintf("consumer %q on stream %q (%d messages not delivered yet, %d awaiting an ack)",
		cfg.Consumer, cfg.Stream, info.NumPending, info.NumAckPending)}
	switch {
	case force:
	case info.Config.Description != consumerDescription:
		it.keep = fmt.Sprintf("not created by courier (description %q): --force removes it", info.Config.Description)
	case info.NumWaiting > 0:
		it.keep = fmt.Sprintf("a courier seems to be consuming it (%d pull requests waiting): stop it first, or --force", info.NumWaiting)
	}
	if it.keep == "" {
		it.remove = func(ctx context.Context) error { return js.DeleteConsumer(ctx, cfg.Stream, cfg.Consumer) }
	}
	return it, nil
}

// advisoryDescription starts the description giveup gives the stream it
// creates.
const advisoryDescription = "courier: max-deliveries advisories"

func planAdvisories(ctx context.Context, js jetstream.JetStream, cfg config.Config, force bool) (*item, error) {
	it, err := planAdvisoriesOf(ctx, js, cfg.Stream, cfg.Consumer, force)
	if it == nil || err != nil {
		return it, err
	}
	return it, keepForLiveCourier(ctx, js, cfg, force, it, "turns the advisories it captures into dead letters")
}

// keepForLiveCourier keeps it, which a running courier of cfg's durable
// uses (what uses says), unless forced or kept already: removed under it,
// the courier would fail until it restarts.
func keepForLiveCourier(ctx context.Context, js jetstream.JetStream, cfg config.Config, force bool, it *item, uses string) error {
	if force || it.keep != "" {
		return nil
	}
	live, err := liveCourier(ctx, js, cfg)
	if err != nil || live == "" {
		return err
	}
	it.keep = fmt.Sprintf("%s, which %s: stop it first, or --force", live, uses)
	it.remove = nil
	return nil
}

// liveCourier says whether a courier seems to be running on cfg's durable:
// pull requests wait on its consumer, or on its partitions' (a courier
// keeps one waiting while it runs). It returns why it seems so, or "".
func liveCourier(ctx context.Context, js jetstream.JetStream, cfg config.Config) (string, error) {
	waiting := 0
	c, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	switch {
	case err == nil:
		waiting += c.CachedInfo().NumWaiting
	case !errors.Is(err, jetstream.ErrStreamNotFound) && !errors.Is(err, jetstream.ErrConsumerNotFound):
		return "", fmt.Errorf("looking up consumer %q on stream %q: %w", cfg.Consumer, cfg.Stream, err)
	}
	d, err := partition.Find(ctx, js, cfg.Stream, cfg.Consumer)
	if err != nil {
		return "", err
	}
	if d != nil {
		for _, pc := range d.Consumers {
			waiting += pc.CachedInfo().NumWaiting
		}
	}
	if waiting == 0 {
		return "", nil
	}
	return fmt.Sprintf("a courier seems to be running on consumer %q (%d pull requests waiting)", cfg.Consumer, waiting), nil
}

// planAdvisoriesOf is planAdvisories for consumer (giveup.AllConsumers: every
// one) of stream.
func planAdvisoriesOf(ctx context.Context, js jetstream.JetStream, stream, consumer string, force bool) (*item, error) {
	name := giveup.StreamName(stream, consumer)
	s, err := js.Stream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
	case err != nil:
		return nil, fmt.Errorf("looking up stream %q: %w", name, err)
	}
	if s == nil || !slices.Contains(s.CachedInfo().Config.Subjects, giveup.AdvisorySubject(stream, consumer)) {
		// Stream names are upper-cased: that name is another stream's
		// (COURIER_STREAM=orders beside ORDERS), and this one's advisories
		// went to a stream of a name of its own, found by its subject.
		if s, err = ownAdvisoryStream(ctx, js, stream, consumer); s == nil || err != nil {
			return nil, err
		}
		name = s.CachedInfo().Config.Name
	}
	info := s.CachedInfo()
	it := &item{what: fmt.Sprintf("stream %q (max-deliveries advisories, %d waiting)", name, info.State.Msgs)}
	switch {
	case !strings.HasPrefix(info.Config.Description, advisoryDescription):
		it.keep = "not created by courier: delete it yourself if it is not needed (nats stream rm)"
	case force:
	case info.State.Msgs > 0:
		it.keep = "advisories wait to be turned into dead letters: run the sidecar until they are, or --force"
	}
	if it.keep == "" {
		it.remove = func(ctx context.Context) error { return js.DeleteStream(ctx, name) }
	}
	return it, nil
}

// ownAdvisoryStream is the stream courier created for the advisories of
// consumer on stream under a name other than giveup.StreamName; nil when
// there is none (a stream of the operator's capturing them is not courier's
// to remove).
func ownAdvisoryStream(ctx context.Context, js jetstream.JetStream, stream, consumer string) (jetstream.Stream, error) {
	subject := giveup.AdvisorySubject(stream, consumer)
	name, err := js.StreamNameBySubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("looking up the stream capturing %q: %w", subject, err)
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("looking up stream %q: %w", name, err)
	}
	if !strings.HasPrefix(s.CachedInfo().Config.Description, advisoryDescription) {
		return nil, nil
	}
	return s, nil
}

// deadLetterDescription is the description dlq gives the stream it creates.
const deadLetterDescription = "courier dead letters"

func planDeadLetters(ctx context.Context, js jetstream.JetStream, cfg config.Config, force bool) (*item, error) {
	name, err := js.StreamNameBySubject(ctx, cfg.DLQSubject)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("looking up the stream capturing %q: %w", cfg.DLQSubject, err)
	}
	if name == cfg.Stream {
		return nil, nil // listed as the consumed stream
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("looking up stream %q: %w", name, err)
	}
	info := s.CachedInfo()
	it := &item{what: fmt.Sprintf("stream %q (dead letters on %s, %d stored)", name, cfg.DLQSubject, info.State.Msgs)}
	ours := info.Config.Description == deadLetterDescription &&
		len(info.Config.Subjects) == 1 && info.Config.Subjects[0] == cfg.DLQSubject
	switch {
	case !ours:
		it.keep = "not created by courier (or it captures more): delete it yourself if it is not needed (nats stream rm)"
	case force:
	case info.State.Msgs > 0:
		it.keep = "holds dead letters: replay or purge them ('courier dlq'), or --force to delete them with it"
	}
	if it.keep == "" {
		it.remove = func(ctx context.Context) error { return js.DeleteStream(ctx, name) }
	}
	return it, keepForLiveCourier(ctx, js, cfg, force, it, "stores its dead letters there")
}

// planOrderMarks finds the bucket of order per key's marks (ordermark),
// whether or not COURIER_ORDER_KEY is set now: it is kept with the
// consumer, whose crash safety it holds.
func planOrderMarks(ctx context.Context, js jetstream.JetStream, cfg config.Config, force bool) (*item, error) {
	name := ordermark.BucketName(cfg.Stream, cfg.Consumer)
	kv, err := js.KeyValue(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("looking up key-value bucket %q: %w", name, err)
	}
	marks, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing key-value bucket %q: %w", name, err)
	}
	n := 0
	for range marks.Keys() {
		n++
	}
	st, err := js.Stream(ctx, "KV_"+name) // a bucket's stream
	if err != nil {
		return nil, fmt.Errorf("looking up key-value bucket %q: %w", name, err)
	}
	it := &item{what: fmt.Sprintf("key-value bucket %q (order per key's marks, %d keys)", name, n)}
	consumer, err := planConsumer(ctx, js, cfg, force)
	owner := jsutil.CheckOwner("key-value bucket", name, st.CachedInfo().Config.Metadata, jsutil.Owner{Stream: cfg.Stream, Consumer: cfg.Consumer})
	var oerr *jsutil.OwnerError
	switch {
	case err != nil:
		return nil, err
	case errors.As(owner, &oerr):
		// Bucket names lose what sets two durables apart: it is the
		// other's, never removed for this one, even with --force.
		it.keep = fmt.Sprintf("it is the marks of consumer %q on stream %q, whose names make the same bucket name", oerr.Owner.Consumer, oerr.Owner.Stream)
	case st.CachedInfo().Config.Description != ordermark.Description:
		it.keep = "not created by courier: delete it yourself if it is not needed (nats kv rm)"
	case consumer != nil && consumer.keep != "":
		it.keep = "the consumer is kept, and a courier that starts on it reads these marks"
	}
	if it.keep == "" {
		it.remove = func(ctx context.Context) error { return js.DeleteKeyValue(ctx, name) }
	}
	return it, nil
}

// planRewinds finds the bucket of the durable's rewinds (courier rewind),
// kept with the consumer, whose couriers watch it.
func planRewinds(ctx context.Context, js jetstream.JetStream, cfg config.Config, force bool) (*item, error) {
	name := rewind.BucketName(cfg.Stream, cfg.Consumer)
	found, oerr, err := bucketOwner(ctx, js, cfg, name)
	if !found || err != nil {
		return nil, err
	}
	it := &item{what: fmt.Sprintf("key-value bucket %q (the durable's rewinds)", name)}
	consumer, err := planConsumer(ctx, js, cfg, force)
	switch {
	case err != nil:
		return nil, err
	case oerr != nil:
		// Never another durable's, even with --force.
		it.keep = fmt.Sprintf("it is the rewinds of consumer %q on stream %q, whose names make the same bucket name", oerr.Owner.Consumer, oerr.Owner.Stream)
	case consumer != nil && consumer.keep != "":
		it.keep = "the consumer is kept, and the couriers on it watch its rewinds here"
	default:
		it.remove = func(ctx context.Context) error { return js.DeleteKeyValue(ctx, name) }
	}
	// A partitioned durable has no consumer on the stream: its couriers
	// are seen by their partitions' pulls.
	return it, keepForLiveCourier(ctx, js, cfg, force, it, "watches its rewinds there")
}

// bucketOwner looks key-value bucket name up: found is false when it does
// not exist; oerr, when it records another durable than cfg's (names of
// two durables can make one bucket name), never to be removed for cfg's.
func bucketOwner(ctx context.Context, js jetstream.JetStream, cfg config.Config, name string) (found bool, oerr *jsutil.OwnerError, err error) {
	kv, err := js.KeyValue(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return false, nil, nil
	} else if err != nil {
		return false, nil, fmt.Errorf("looking up key-value bucket %q: %w", name, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return false, nil, fmt.Errorf("looking up key-value bucket %q: %w", name, err)
	}
	if errors.As(jsutil.CheckOwner("key-value bucket", name, st.Metadata(), jsutil.Owner{Stream: cfg.Stream, Consumer: cfg.Consumer}), &oerr) {
		return true, oerr, nil
	}
	return true, nil, nil
}

// planPinHolders finds the membership bucket of a durable with order per
// key and no partitions (pinwatch.go); a partitioned durable's is found by
// planPartitions.
func planPinHolders(ctx context.Context, js jetstream.JetStream, cfg config.Config, force bool) (*item, error) {
	if d, err := partition.Find(ctx, js, cfg.Stream, cfg.Consumer); err != nil || d != nil {
		return nil, err
	}
	name := partition.MembersBucket(cfg.Stream, cfg.Consumer)
	found, oerr, err := bucketOwner(ctx, js, cfg, name)
	if !found || err != nil {
		return nil, err
	}
	it := &item{what: fmt.Sprintf("key-value bucket %q (the couriers holding the durable's pin)", name)}
	consumer, err := planConsumer(ctx, js, cfg, force)
	switch {
	case err != nil:
		return nil, err
	case oerr != nil:
		it.keep = fmt.Sprintf("it is the couriers of consumer %q on stream %q, whose names make the same bucket name", oerr.Owner.Consumer, oerr.Owner.Stream)
	case consumer != nil && consumer.keep != "":
		it.keep = "the consumer is kept, and the couriers on it name themselves here"
	default:
		it.remove = func(ctx context.Context) error { return js.DeleteKeyValue(ctx, name) }
	}
	return it, nil
}
