package jsutil_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/jsutil"
	"github.com/courierhq/courier/internal/natstest"
)

// A bucket is its first durable's: opened again by it, it is updated; by
// another durable, refused with an *OwnerError naming both, and left as it
// is; one made before owners were recorded is taken by the first to open
// it. Two durables opening one at once: one has it, the other is refused.
func TestOwnedKeyValue(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ab := jsutil.Owner{Stream: "A_B", Consumer: "C"}
	a := jsutil.Owner{Stream: "A", Consumer: "B_C"}
	cfg := jetstream.KeyValueConfig{Bucket: "B1", Description: "marks", History: 1}

	kv, err := jsutil.OwnedKeyValue(ctx, js, cfg, ab)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.PutString(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	cfg.History = 2
	if kv, err = jsutil.OwnedKeyValue(ctx, js, cfg, ab); err != nil {
		t.Fatalf("opened again by its owner: %v", err)
	}
	if st, _ := kv.Status(ctx); st.History() != 2 || st.Metadata()[jsutil.MetaOwnerStream] != "A_B" || st.Metadata()[jsutil.MetaOwnerConsumer] != "C" {
		t.Errorf("after an update: history %d, metadata %v; want 2 and the owner kept", st.History(), st.Metadata())
	}
	_, err = jsutil.OwnedKeyValue(ctx, js, cfg, a)
	var oerr *jsutil.OwnerError
	if !errors.As(err, &oerr) || oerr.Owner != ab || oerr.Wanted != a || !strings.Contains(err.Error(), `"B1" belongs to consumer "C" on stream "A_B"`) {
		t.Fatalf("opened by another durable: %v, want an *OwnerError naming both", err)
	}
	if e, err := kv.Get(ctx, "k"); err != nil || string(e.Value()) != "v" {
		t.Errorf("the owner's key after the refusal: %v, %v", e, err)
	}

	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "OLD"}); err != nil {
		t.Fatal(err)
	}
	if _, err := jsutil.OwnedKeyValue(ctx, js, jetstream.KeyValueConfig{Bucket: "OLD"}, a); err != nil {
		t.Fatalf("a bucket without an owner: %v, want it taken", err)
	}
	if _, err := jsutil.OwnedKeyValue(ctx, js, jetstream.KeyValueConfig{Bucket: "OLD"}, ab); !errors.As(err, &oerr) {
		t.Errorf("once taken, by another durable: %v, want refused", err)
	}

	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, o := range []jsutil.Owner{ab, a} {
		wg.Go(func() { _, errs[i] = jsutil.OwnedKeyValue(ctx, js, jetstream.KeyValueConfig{Bucket: "RACE"}, o) })
	}
	wg.Wait()
	if (errs[0] == nil) == (errs[1] == nil) || !errors.As(errors.Join(errs...), &oerr) {
		t.Errorf("two durables at once: %v; want one refused", errs)
	}
}

// The stream of a durable whose plain name another durable's stream has
// goes under a name of its own; each durable's is found again under
// whichever name it has, the plain one first; a stream that does not say
// whose it is is taken as the caller's; when both names are others', an
// *OwnerError names the owner of the plain one.
func TestOwnedStreamName(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	whose := func(cfg jetstream.StreamConfig) (jsutil.Owner, bool) { return jsutil.OwnerOf(cfg.Metadata) }
	name := func(o jsutil.Owner) string {
		t.Helper()
		n, err := jsutil.OwnedStreamName(ctx, js, "S_A_B_C", o, whose)
		if err != nil {
			t.Fatalf("OwnedStreamName for %v: %v", o, err)
		}
		return n
	}
	create := func(n string, md map[string]string) {
		t.Helper()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: n, Metadata: md}); err != nil {
			t.Fatal(err)
		}
	}
	ab := jsutil.Owner{Stream: "A_B", Consumer: "C"}
	a := jsutil.Owner{Stream: "A", Consumer: "B_C"}
	other := jsutil.Owner{Stream: "A_B_C", Consumer: ""}

	if got := name(ab); got != "S_A_B_C" {
		t.Errorf("none made: %s, want the plain name", got)
	}
	create("S_A_B_C", ab.Metadata(nil))
	if got := name(ab); got != "S_A_B_C" {
		t.Errorf("its own made: %s, want the plain name", got)
	}
	distinct := name(a)
	if distinct == "S_A_B_C" || !strings.HasPrefix(distinct, "S_A_B_C_") {
		t.Fatalf("the plain name another's: %s, want one of its own", distinct)
	}
	create(distinct, a.Metadata(nil))
	if got := name(a); got != distinct {
		t.Errorf("its own made under its name: %s, want %s", got, distinct)
	}
	if err := js.DeleteStream(ctx, "S_A_B_C"); err != nil {
		t.Fatal(err)
	}
	if got := name(a); got != distinct {
		t.Errorf("the plain name free again: %s, want its own stream's %s", got, distinct)
	}

	create("S_A_B_C", nil)
	if got := name(other); got != "S_A_B_C" {
		t.Errorf("a stream that does not say whose: %s, want it taken as the caller's", got)
	}
	if err := js.DeleteStream(ctx, "S_A_B_C"); err != nil {
		t.Fatal(err)
	}
	create("S_A_B_C", ab.Metadata(nil))
	create(jsutil.DistinctName("S_A_B_C", other.Stream+"\x00"+other.Consumer), a.Metadata(nil))
	_, err := jsutil.OwnedStreamName(ctx, js, "S_A_B_C", other, whose)
	var oerr *jsutil.OwnerError
	if !errors.As(err, &oerr) || oerr.Owner != ab || oerr.Wanted != other || !strings.Contains(err.Error(), `stream "S_A_B_C" belongs to consumer "C" on stream "A_B"`) {
		t.Errorf("both names others': %v, want an *OwnerError naming the plain name's owner", err)
	}
}
