package publish

// DELETE SchedulesPath + <id> cancels a delayed publish whose time has not
// come (schedule.Cancel): 204, then 404 (delivered, cancelled or unknown);
// 409 once its time is within schedule.CancelMargin (it is left to be
// delivered); 400 for what is no schedule id. Who may cancel is who may
// publish (admit), and what: a schedule to a subject it may publish to
// (403 otherwise).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/courierhq/courier/schedule"
)

// SchedulesPath is where schedules are cancelled: DELETE SchedulesPath +
// the id a delayed publish was answered with.
const SchedulesPath = "/v1/schedules/"

// allowDelete is the Allow header of a 405 on SchedulesPath.
var allowDelete = []string{http.MethodDelete}

// serveCancel answers DELETE SchedulesPath + id.
func (s *Server) serveCancel(w http.ResponseWriter, r *http.Request, id string) {
	if r.Method != http.MethodDelete {
		w.Header()["Allow"] = allowDelete
		s.answer(w, result{status: http.StatusMethodNotAllowed,
			msg: fmt.Sprintf("method %s is not served: cancel a schedule with DELETE %s<id>", r.Method, SchedulesPath)})
		return
	}
	res := s.cancel(r, id)
	if res.status == http.StatusNoContent {
		w.WriteHeader(res.status)
	} else {
		s.answer(w, res)
	}
	if s.log.Enabled(r.Context(), slog.LevelDebug) {
		s.log.Debug("schedule cancel", "schedule", id, "status", res.status, "reason", res.msg)
	}
}

// cancel decides a cancel of schedule id within the publish timeout.
func (s *Server) cancel(r *http.Request, id string) result {
	if res := s.admit(r); res != nil {
		return *res
	}
	sid, err := schedule.ParseID(id)
	if err != nil {
		return result{status: http.StatusBadRequest, msg: err.Error()}
	}
	deadline := time.Now().Add(s.o.Timeout)
	if err := s.waitConnected(r.Context(), deadline); err != nil {
		return s.timedOut(r.Context(), err)
	}
	ctx, cancel := context.WithDeadline(r.Context(), deadline)
	defer cancel()
	// What a caller may cancel is what it may publish: a schedule whose
	// subject is among Options.Subjects.
	info, err := schedule.Lookup(ctx, s.js, s.o.SchedulePrefix, sid)
	if err == nil {
		if err := s.allowed(info.Target); err != nil {
			return fail(err)
		}
		info, err = schedule.Cancel(ctx, s.js, s.o.SchedulePrefix, sid, time.Now())
	}
	switch {
	case err == nil:
		s.m.cancelled.Inc()
		s.log.Info("schedule cancelled", "schedule", id, "subject", info.Target, "deliver_at", info.DeliverAt.Format(time.RFC3339Nano))
		return result{status: http.StatusNoContent}
	case errors.Is(err, schedule.ErrNotFound):
		return result{status: http.StatusNotFound, msg: err.Error()}
	case errors.Is(err, schedule.ErrDue):
		return result{status: http.StatusConflict, msg: err.Error()}
	}
	return s.timedOut(r.Context(), err)
}
