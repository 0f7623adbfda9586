// Package proxy owns one message's life in courier: its dedup key, the dedup
// check, the HTTP request to the app, the classification of the answer, and
// the ack / NAK-with-delay / dead-letter decision; plus the fetch loop and the
// bounded worker pool around it, which hold what they have while the app (or
// the dedup store) is unavailable. It knows nothing of Badger, of the shared
// bucket or of how dead letters are stored: it declares Deduper,
// DeadLetterer, SuccessPublisher and OrderMarks and is given
// implementations. What it writes through them is its own, though: besides
// idempotency keys, references.go records the marks of reference dead
// letters in the Deduper, under keys no idempotency key can be.
//
// # A message's route
//
// A message travels through the files in this order:
//
//  1. source.go: where a worker's next message comes from. fetch.go pulls
//     it (pin.go: a priority group's pin; takeover.go: how the pin goes
//     from one courier to the next), tracker.go keeps it in progress
//     and sourced.go gives a partition's message its original subject;
//     with order per key, order.go holds it behind an earlier message of
//     its key (ordermarks.go: that order across restarts and takeovers;
//     partition.go: partitions and their hand-over).
//  2. proxy.go: a worker takes it and hands it to the decider.
//  3. decide.go: the decider, over one delivery (delivery.go: what
//     travels, its key resolved by request.go). It holds the message while
//     the gate is closed (hold.go; gate.go and cause.go: the app or the
//     dedup store unavailable, the consumer paused; breaker.go: the breaker
//     open, and which held message goes as its probe); ends it before it is
//     sent if it must (references.go: the original of a reference dead
//     letter; its max age; checkkey.go: the dedup check and the claim);
//     gives it its headers (request.go) and span (trace.go); sends it by its
//     way, alone or in a batch (batcher.go gathers entries, handoff.go hands
//     a delivery to a batch and settles what the batch answered); and says
//     the ending the answer makes of it (decide, endingOf; ending.go: the
//     one type of every ending), or holds it and sends it again.
//  4. send.go: the one path of every request to the app: the grace period,
//     the rate limit, a slot of the in-flight limit (inflight.go, package
//     limit), the timeout (timeout.go), the signature, the POST to its
//     target (routes.go); the HTTP exchange and what an answer means are
//     apphttp's.
//  5. settle.go: how the delivery ends, the settler: acked once its success
//     record is stored and its key recorded (the recorder), acked as a
//     duplicate, NAK'd for a retry (backoff.go: its delay), dead-lettered
//     (references.go: a letter too large to carry its body keeps its
//     original), or given back; order per key hears how once (told).
//
// proxy.go wires these parts (New) and runs them (Run); given.go declares
// what a Runner is given, options.go how it is set; phases.go names the
// steps of shutdown; metrics.go, summary.go and log.go say what happened.
// The parts below the decision (the settler, the sender, the limit, and
// delivery.go, what travels between them) are given what they need and use
// nothing of the parts above them: the decider, the workers, the batcher,
// the source and order per key, the holds.
//
// # Parts
//
// From the top down; each uses only those below it (parts_test.go keeps
// the settler, the send path and what travels from naming anything above):
//
//   - the Runner (proxy.go, summary.go, state.go): wires one subscription's
//     path and runs its workers and shutdown, and says what it is doing
//     (State);
//   - the decider (decide.go, checkkey.go, handoff.go): one delivery from
//     its worker to its ending;
//   - batches (batcher.go): entries gathered into one request;
//   - tracing (trace.go): an attempt's span, a batch's;
//   - the source and order per key (source.go, fetch.go, pin.go,
//     takeover.go, order.go, ordermarks.go, partition.go): the next
//     message, in its key's order;
//   - the holds (hold.go, gate.go, breaker.go): when nothing may be sent;
//   - the settler (ending.go, settle.go, references.go, backoff.go): every
//     ending;
//   - the send path (send.go, inflight.go, routes.go, package limit);
//   - what travels (delivery.go, request.go, phases.go, tracker.go,
//     sourced.go, timeout.go);
//   - what is given (given.go, options.go, cause.go, metrics.go, log.go).
//
// # Words
//
//   - delivery: one delivery of a message, from a worker taking it to its
//     settling; its attempt is JetStream's delivery count.
//   - ending: how a delivery ends, as the decider says it and the settler
//     carries it out: one type, its kinds and their labels in metrics,
//     spans and logs in one file (ending.go).
//   - settle: end a delivery for good on the server: ack, NAK or Term.
//   - give back: settle a delivery with a NAK without delay, so that another
//     delivery takes the message at once (at shutdown, a partition handed
//     on). Counted as released (courier_messages_total{outcome="released"},
//     Runner.Released).
//   - retry: settle with a NAK with a delay; JetStream's delivery count is
//     the one retry counter.
//   - hold: keep a message in progress, spending none of its deliveries,
//     while the gate is closed.
//   - claim: a dedup store's hold on a key while one delivery of it runs
//     (Deduper.Check takes it, Deduper.Release gives it up); in this
//     process, a key's flight (tracker.go).
//   - slot: a request's place in the in-flight limit (package limit).
//   - place: with batches, a message a worker holds or an entry handed to a
//     batch (handoff.go).
//   - line: the messages of one ordering key, in stream order (order.go);
//     its head is the one being delivered.
//   - target: where a request goes: the app's URL or a route's (routes.go).
//   - replay: a delivery of a message a rewind of the durable (courier
//     rewind, JetStream's consumer reset; Options.Rewinds) delivers again:
//     its key is checked and recorded in the rewind's scope (replayKey), so
//     it reaches the app once per rewind, marked HeaderReplay.
//   - superseded: a partition's message copied before a rewind that copies
//     its origin again (Rewinds.Superseded, sourced.go): acked unsent, as a
//     duplicate, and not awaited by its key's line, for the rewind's copy
//     delivers it in its key's order.
//   - out: what a consumer has delivered and not had settled, with this
//     courier or another; at a takeover, the keys of what is out wait for
//     it (takeover.go).
//   - term: this courier's standing in its durable's membership
//     (Membership.Term); once it lapses, nothing held of a pinned group is
//     sent: another courier may have the pin.
package proxy
