package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// The demo's delayed part: once the invoices are stored, the app publishes
// a payment reminder through courier with Courier-Delay: 2s. JetStream
// holds it as a schedule (the INVOICES stream allows schedules and
// captures _sched.INVOICES.>) and publishes it at its time, when courier
// delivers it as any message: it reaches the app two seconds later, not
// before (docs/delayed-delivery.md).

// reminderDelay is how long the reminder waits.
const reminderDelay = 2 * time.Second

// reminderKey is the reminder's idempotency key.
const reminderKey = "invoice-1-reminder"

// sendReminder publishes the reminder through courier's publish API at
// base and waits, until timeout, for it to reach the app.
func sendReminder(ctx context.Context, app *invoiceApp, base string, timeout time.Duration) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/publish/invoices.reminder",
		bytes.NewReader([]byte(`{"invoice":1,"reminder":true}`)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", reminderKey)
	req.Header.Set("Courier-Delay", reminderDelay.String())
	sent := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("demo: publishing the reminder: %w", err)
	}
	var answer struct {
		Schedule  string `json:"schedule"`
		DeliverAt string `json:"deliver_at"`
		Error     string `json:"error"`
	}
	err = json.NewDecoder(resp.Body).Decode(&answer)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("demo: the reminder was answered %d %s %v", resp.StatusCode, answer.Error, err)
	}
	app.say("app published a payment reminder with Courier-Delay: %s → 202, schedule %s, due at %s: JetStream holds it until then",
		reminderDelay, answer.Schedule, answer.DeliverAt)
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-deadline.C:
			return fmt.Errorf("demo: the reminder did not reach the app within %s", timeout)
		case <-tick.C:
			if at, ok := app.arrival(reminderKey); ok {
				app.say("the reminder reached the app %.1fs after it was published, at its time", at.Sub(sent).Seconds())
				return nil
			}
		}
	}
}
