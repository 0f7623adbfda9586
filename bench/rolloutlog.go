package main

// What the couriers of a run of the rollout scenario (rollout.go) logged:
// read from their JSON logs, and the lines around the longest wait, the
// stall's cause as courier names it.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// courierLog is what one courier logged, line by line.
type courierLog struct{ lines []logLine }

// logLine is one line of courier's JSON log: when, and the rest as text.
type logLine struct {
	at      time.Time
	level   string
	msg     string
	text    string
	courier int
}

// readCourierLog reads a log of courier's JSON lines.
func readCourierLog(path string) courierLog {
	var out courierLog
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) != nil {
			continue
		}
		at, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(rec["time"]))
		level, msg := fmt.Sprint(rec["level"]), fmt.Sprint(rec["msg"])
		text := level + " " + msg
		keys := make([]string, 0, len(rec))
		for k := range rec {
			if k != "time" && k != "level" && k != "msg" {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			text += fmt.Sprintf(" %s=%v", k, rec[k])
		}
		if len(text) > 300 {
			text = text[:300] + "…"
		}
		out.lines = append(out.lines, logLine{at: at, level: level, msg: msg, text: text})
	}
	return out
}

// worstWait names the message published in [start, end) that waited
// longest, and returns what the couriers logged from a second before it
// was published until it was called.
func worstWait(t *tally, sent []time.Time, start, end time.Time, logs []courierLog) (string, []string) {
	worst, wait := -1, time.Duration(0)
	for id, at := range sent {
		if at.Before(start) || !at.Before(end) || !t.seen[id].Load() {
			continue
		}
		if d := time.Duration(t.lat[id].Load()); d > wait {
			worst, wait = id, d
		}
	}
	if worst < 0 {
		return "", nil
	}
	from, to := sent[worst].Add(-time.Second), sent[worst].Add(wait)
	var lines []logLine
	for i, l := range logs {
		for _, ln := range l.lines {
			if !ln.at.Before(from) && !ln.at.After(to) && !startUpLine(ln.msg) {
				ln.courier = i
				lines = append(lines, ln)
			}
		}
	}
	slices.SortFunc(lines, func(a, b logLine) int { return a.at.Compare(b.at) })
	var out []string
	for _, ln := range lines {
		if len(out) == 12 {
			out = append(out, fmt.Sprintf("... and %d more", len(lines)-12))
			break
		}
		out = append(out, fmt.Sprintf("%+.3fs c%d %s", ln.at.Sub(sent[worst]).Seconds(), ln.courier, ln.text))
	}
	name := fmt.Sprintf("message %d (entity e%d), published %+.3fs into the event, waited %s",
		worst, worst%rolloutEntities, sent[worst].Sub(start).Seconds(), fmtSec(wait))
	return name, out
}

// warnings counts the lines logged at warn or error, and returns the
// earliest.
func warnings(logs []courierLog) (int, string) {
	n, first := 0, logLine{}
	for i, l := range logs {
		for _, ln := range l.lines {
			if ln.level != "WARN" && ln.level != "ERROR" {
				continue
			}
			n++
			if first.text == "" || ln.at.Before(first.at) {
				first, first.courier = ln, i
			}
		}
	}
	if n == 0 {
		return 0, ""
	}
	return n, fmt.Sprintf("c%d %s", first.courier, first.text)
}

// startUpLine reports whether msg is one of the lines every courier logs
// as it starts or stops, which say nothing of a stall.
func startUpLine(msg string) bool {
	if msg == "consuming" { // not "consuming again", which may be the cause
		return true
	}
	for _, p := range []string{"courier starting", "features in force", "connected to NATS", "dedup keys in a shared",
		"catching max-deliveries", "sharing the durable's partitions", "summary", "courier stopped"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
