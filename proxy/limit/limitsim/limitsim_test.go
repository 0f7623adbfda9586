package limitsim

import (
	"context"
	"os"
	"testing"
	"time"
)

// BenchmarkCompare prints the table courier's default is judged on: auto
// against fixed limits of 8 and 64, on an app of 8 workers × 10ms, an
// instant app and a 20ms app with unlimited workers. It reports figures and
// asserts nothing:
//
//	go test -run '^$' -bench Compare -benchtime 1x ./proxy/limit/limitsim/
//
// (-bench Compare/instant for one app.)
func BenchmarkCompare(b *testing.B) {
	for _, c := range Cases() {
		b.Run(c.Name, func(b *testing.B) {
			for b.Loop() {
				if _, err := Compare(context.Background(), os.Stdout, []Case{c}, 3*time.Second, 5*time.Second); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
